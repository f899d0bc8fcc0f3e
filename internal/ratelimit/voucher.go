package ratelimit

import (
	"context"
	"fmt"
)

// voucher runs voucherScript's operation o on c's key, within the budget, and reports whether it
// was admitted (a grant always is; a redemption when there was a grant to take).
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
