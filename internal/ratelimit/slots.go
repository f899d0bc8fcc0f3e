package ratelimit

import (
	"context"
	"fmt"
)

// slotCall runs slotScript's operation o on c's key for holder, within the budget.
func (l *Limiter) slotCall(ctx context.Context, c Check, name string, o Op) (Decision, error) {
	if err := c.Policy.Validate(); err != nil {
		return Decision{}, err
	}
	checks := []Check{c}
	l.stats.redis.Add(1)
	budget, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	r, err := runScript(budget, l.rdb, slotScript, false, []string{l.keys.key(c.Policy, c.Identity)},
		Call{ID: name, Now: l.clockArg(), Op: o, Settings: [][3]any{l.policyArgs(c.Policy)}})
	l.called(ctx, err, checks)
	if err != nil {
		return Decision{}, fmt.Errorf("slot: %w", err)
	}
	return NewDecision(r.Allowed, r.Pairs, checks), nil
}
