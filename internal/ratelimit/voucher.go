package ratelimit

import (
	"context"
	_ "embed"
	"fmt"

	"github.com/redis/go-redis/v9"
)

//go:embed voucher.lua
var voucherLua string

// voucherScript keeps grants that a later request redeems (voucher.lua).
var voucherScript = redis.NewScript(voucherLua)

// Grant records, for c's key, something a later request may redeem once within c.Policy.Window:
// a look-up that a payment will turn into a refund. The key holds at most c.Policy.Limit
// grants (the oldest are dropped past it). The error wraps ErrUnavailable.
func (l *Limiter) Grant(ctx context.Context, c Check) error {
	_, err := l.voucher(ctx, c, requestID())
	return err
}

// Redeem takes one of the grants of c's key made within c.Policy.Window, if there is one, and
// reports whether there was. Each grant is redeemed once, fleet-wide: two replicas redeeming
// at once take two grants or one and nothing. The error wraps ErrUnavailable.
func (l *Limiter) Redeem(ctx context.Context, c Check) (bool, error) {
	return l.voucher(ctx, c, "")
}

// voucher runs voucherScript: a grant of member, or a redemption when member is "".
func (l *Limiter) voucher(ctx context.Context, c Check, member string) (bool, error) {
	if err := c.Policy.Validate(); err != nil {
		return false, err
	}
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	n, err := voucherScript.Run(ctx, l.rdb, []string{l.keys.key(c.Policy, c.Identity)},
		l.clockArg(), c.Policy.Window.Microseconds(), c.Policy.Limit, member).Int()
	if err != nil {
		return false, fmt.Errorf("%w: voucher: %w", ErrUnavailable, err)
	}
	return n == 1, nil
}
