package ratelimit

import (
	"context"
	_ "embed"
	"fmt"

	"github.com/redis/go-redis/v9"
)

//go:embed slots.lua
var slotsLua string

// slotScript runs slots.lua as scripts run an algorithm's body.
var slotScript = redis.NewScript(preludeLua + argsLua + slotsLua)

// Hold takes one of c's in-flight slots (c.Policy.Limit of them, each a lease of
// c.Policy.Window), named name, for a request about to start: refused (Allowed false) while
// every slot is held by other requests. A request already holding the slot of that name (a
// replay of a request still in progress) shares it, never refused. The caller gives it back
// with Release when the request ends; a slot whose replica died is free when its lease ends.
// Slots bypass the deny cache: they free when requests end, which no Reset foretells. The error
// wraps ErrUnavailable.
func (l *Limiter) Hold(ctx context.Context, c Check, name string) (Decision, error) {
	return l.slotCall(ctx, c, name, op{kind: opDecide})
}

// Release gives back the slot name of c's key (Hold). The error wraps ErrUnavailable: the slot
// is then free when its lease ends.
func (l *Limiter) Release(ctx context.Context, c Check, name string) error {
	_, err := l.slotCall(ctx, c, name, op{kind: opWithdraw})
	return err
}

// slotCall runs slotScript's operation o on c's slot name, within the budget.
func (l *Limiter) slotCall(ctx context.Context, c Check, name string, o op) (Decision, error) {
	if err := c.Policy.Validate(); err != nil {
		return Decision{}, err
	}
	checks := []Check{c}
	if err := l.mayCall(checks); err != nil {
		return Decision{}, err
	}
	budget, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	r, err := runScript(budget, l.rdb, slotScript, false, []string{l.keys.key(c.Policy, c.Identity)},
		call{id: name, now: l.clockArg(), op: o, keys: [][3]any{l.policyArgs(c.Policy)}})
	l.called(ctx, err, checks)
	if err != nil {
		return Decision{}, fmt.Errorf("slot: %w", err)
	}
	return newDecision(r.allowed, r.pairs, checks), nil
}
