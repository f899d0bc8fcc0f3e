package ratelimit

import (
	"context"
	"fmt"
)

// Grant records, for c's key, something a later request may redeem once within c.Policy.Window:
// a look-up that a payment will turn into a refund. The key holds at most c.Policy.Limit
// grants (the oldest are dropped past it). The error wraps ErrUnavailable.
func (l *Limiter) Grant(ctx context.Context, c Check) error {
	_, err := l.voucher(ctx, c, Op{kind: opGrant})
	return err
}

// Redeem takes one of the grants of c's key made within c.Policy.Window, if there is one, and
// reports whether there was. Each grant is redeemed once, fleet-wide: two replicas redeeming
// at once take two grants or one and nothing. The error wraps ErrUnavailable.
func (l *Limiter) Redeem(ctx context.Context, c Check) (bool, error) {
	return l.voucher(ctx, c, Op{kind: opDecide})
}

// voucher runs voucherScript's operation o on c's key, within the budget, and reports whether it
// was admitted (a grant always is; a redemption when there was a grant to take). Vouchers
// bypass the deny cache (a key with no grant is no full key) and count in no outage (a voucher
// that cannot be reached only costs a refund); a breaker around the client gates them as any
// call.
func (l *Limiter) voucher(ctx context.Context, c Check, o Op) (bool, error) {
	if err := c.Policy.Validate(); err != nil {
		return false, err
	}
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	r, err := runScript(ctx, l.rdb, voucherScript, false, []string{l.keys.key(c.Policy, c.Identity)},
		Call{ID: requestID(), Now: l.clockArg(), Op: o, Settings: [][3]any{l.policyArgs(c.Policy)}})
	if err != nil {
		return false, fmt.Errorf("voucher: %w", err)
	}
	return r.Allowed, nil
}
