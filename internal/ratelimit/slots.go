package ratelimit

import (
	"context"
	"fmt"
)

// Holder names one request's hold on the slot called name (a PIX's Idempotency-Key, of
// [A-Za-z0-9_-]): requests of one name share one slot, each with a hold of its own, so that each
// gives back only its own.
func Holder(name string) string { return name + ":" + requestID() }

// Hold takes one of c's in-flight slots (c.Policy.Limit of them, each a lease of
// c.Policy.Window) for a request about to start, as holder (Holder): refused (Allowed false)
// while every slot is held by other requests. A request whose slot's name is already held (a
// replay of a request still in progress) shares it, never refused. The caller gives its hold
// back with Release when the request ends; the slot is free once every hold on it is given back
// or has outlived its lease (its replica died). Slots bypass the deny cache: they free when
// requests end, which no Reset foretells. The error wraps ErrUnavailable.
func (l *Limiter) Hold(ctx context.Context, c Check, holder string) (Decision, error) {
	return l.slotCall(ctx, c, holder, Op{kind: opDecide})
}

// Release gives back holder's hold of c's key (Hold). The error wraps ErrUnavailable: the hold
// then ends with its lease.
func (l *Limiter) Release(ctx context.Context, c Check, holder string) error {
	_, err := l.slotCall(ctx, c, holder, Op{kind: opWithdraw})
	return err
}

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
	return newDecision(r.Allowed, r.Pairs, checks), nil
}
