package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"slices"
)

// A Step is one decision of a Sequence: what AllowAll, AskAll, AllowN, Refund, Redeem or Grant
// would decide alone.
type Step struct {
	checks  []Check
	op      op
	voucher bool   // a voucher's step (Redeem, Grant), not an algorithm's
	tokens  bool   // a charge or a refund: token_bucket policies only
	slot    string // an in-flight slot's step (Hold, Release): the holder (Holder)
}

// AllowStep is AllowAll(checks...) as a step.
func AllowStep(checks ...Check) Step { return Step{checks: checks, op: op{kind: opDecide}} }

// AskStep is AskAll(checks...) as a step: it takes nothing, and a sequence goes on past it only
// if it would admit.
func AskStep(checks ...Check) Step { return Step{checks: checks, op: op{kind: opAsk}} }

// ChargeStep is AllowN(c, n) as a step.
func ChargeStep(c Check, n int) Step { return Step{checks: []Check{c}, op: cost(n), tokens: true} }

// RefundStep is Refund(n, checks...) as a step. It is never refused.
func RefundStep(n int, checks ...Check) Step {
	return Step{checks: checks, op: op{kind: opRefund, n: n}, tokens: true}
}

// RedeemStep is Redeem(c) as a step: admitted when it took a grant, refused (ending the
// sequence) when there was none.
func RedeemStep(c Check) Step { return Step{checks: []Check{c}, op: op{kind: opDecide}, voucher: true} }

// GrantStep is Grant(c) as a step. It is never refused.
func GrantStep(c Check) Step { return Step{checks: []Check{c}, op: op{kind: opGrant}, voucher: true} }

// HoldStep is Hold(c, holder) as a step.
func HoldStep(c Check, holder string) Step {
	return Step{checks: []Check{c}, op: op{kind: opDecide}, slot: holder}
}

// AskHoldStep asks whether Hold(c, holder) would take its slot, taking nothing: a PIX asks before
// its own limit decides and takes the slot after it, in one call, so that neither a refused
// limit holds a slot nor a full slot records a PIX.
func AskHoldStep(c Check, holder string) Step {
	return Step{checks: []Check{c}, op: op{kind: opAsk}, slot: holder}
}

// ReleaseStep is Release(c, holder) as a step. It is never refused.
func ReleaseStep(c Check, holder string) Step {
	return Step{checks: []Check{c}, op: op{kind: opWithdraw}, slot: holder}
}

// validate checks what the step's lone call would check.
func (s Step) validate() error {
	if len(s.checks) == 0 || (s.voucher || s.slot != "") && len(s.checks) != 1 {
		return errors.New("ratelimit: a step needs checks (a voucher's or a slot's, one)")
	}
	if s.slot != "" {
		return s.checks[0].Policy.Validate()
	}
	if err := oneQueue(s.checks); err != nil {
		return err
	}
	for _, c := range s.checks {
		switch {
		case s.tokens && (c.Policy.algorithm() != TokenBucket || s.op.kind == opRefund && s.op.n < 1 || s.op.n < 0):
			return fmt.Errorf("ratelimit: %d tokens of %s: want a token_bucket policy, and 1 or more to refund", s.op.n, c.Policy.Name)
		case s.voucher:
			if err := c.Policy.Validate(); err != nil {
				return err
			}
		}
	}
	return nil
}

// cached says whether the deny cache answers and learns the step, as it does AllowAll, AskAll
// and AllowN: a voucher with no grant is no full key, and a refund is never refused.
func (s Step) cached() bool { return !s.voucher && s.slot == "" && s.op.kind != opRefund }

// body is the number of the step's body in a sequence's script (sequence.lua calls
// decisions[body]): an algorithm's place in Algorithms(), from 1, then the voucher's and the
// slots'.
func (s Step) body() int {
	switch {
	case s.voucher:
		return voucherBody
	case s.slot != "":
		return slotBody
	}
	return bodyOf(s.checks[0].Policy.algorithm())
}

// Sequence decides steps one after another, as the same calls made one by one in that order
// would (AllowAll, AskAll, AllowN, Refund, Redeem, Grant), and stops at the first that refuses.
// It returns the decisions of the steps that ran: fewer than the steps when one refused, the
// last of them that refusal. A PIX asks its look-up buckets, then decides its own limit, in one
// Sequence: a refused ask records nothing anywhere.
//
// On one Redis a sequence is one script call (sequence.lua), atomic: nothing comes between its
// steps. On a cluster, whose keys live apart, each step is its own call, as the lone call would
// be, so a sequence costs a call per step run.
//
// Price: a sequence is never batched. The deny cache answers its first step from memory, as it
// would that step alone, and learns from every step's refusal (unless a refund in the sequence
// may have made room), but a later step's key known to be full is asked of Redis, which refuses
// it (KnownFull asks the cache first). A sequence counts once in Stats.Redis, and towards the
// breaker as any call. The error wraps ErrUnavailable when Redis did not answer. On one Redis
// none of the steps is then known to have run, and the sliding log's admissions among them are
// withdrawn; on a cluster the decisions returned with the error are of the steps that ran
// before the one that failed.
func (l *Limiter) Sequence(ctx context.Context, steps ...Step) ([]Decision, error) {
	if len(steps) == 0 {
		return nil, errors.New("ratelimit: no steps")
	}
	var all []Check
	steps = slices.Clone(steps)
	for i, s := range steps {
		if err := s.validate(); err != nil {
			return nil, err
		}
		all = append(all, s.checks...)
		if !s.voucher && s.slot == "" && queued(s.checks) && s.op.kind == opDecide {
			if l.waiters.full(s.checks[0].Identity) { // no place taken: the replica cannot hold one more
				return l.unasked(steps[:i], l.tooManyWaiting(s.checks)), nil
			}
			steps[i].op = l.queueOp(ctx, s.op)
		}
	}
	if l.cluster {
		return l.sequenceApart(ctx, steps)
	}
	sent := l.clock()
	keys := make([][]string, len(steps))
	for i, s := range steps {
		keys[i] = l.keysOf(s.checks)
		if s.op.kind == opRefund {
			l.forgetBlocks(keys[i]) // as Refund does
		}
	}
	if steps[0].cached() {
		if d, ok := l.refuseCached(keys[0], steps[0].checks, sent); ok {
			l.stats.denyCached.Add(1)
			return []Decision{d}, nil
		}
	}
	if err := l.mayCall(all); err != nil {
		return nil, err
	}
	ds, err := l.runSequence(ctx, steps, keys)
	l.called(ctx, err, all)
	refunds := slices.ContainsFunc(steps, func(s Step) bool { return s.op.kind == opRefund })
	for i, d := range ds {
		if steps[i].cached() && !refunds { // a refund after a full step may have made room
			l.learn(d, keys[i], steps[i].checks, sent)
		}
	}
	return ds, err
}

// unasked are the decisions of steps that were not asked, each admitted with its keys' capacity
// as Remaining (as refuseCached reports the keys it did not ask), then last, the refusal.
func (l *Limiter) unasked(steps []Step, last Decision) []Decision {
	ds := make([]Decision, 0, len(steps)+1)
	for _, s := range steps {
		d := Decision{Allowed: true, Results: make([]Result, len(s.checks))}
		for j, c := range s.checks {
			d.Results[j] = Result{Policy: c.Policy, Capacity: c.Policy.Capacity(), Remaining: c.Policy.Capacity()}
		}
		d.Worst = d.Results[0]
		ds = append(ds, d)
	}
	return append(ds, last)
}

// KnownFull answers checks as AllowAll would from this Limiter's deny cache alone, with no call:
// refused (Decision.DenyCached) when one of their keys is known to be full, ok false otherwise.
// A caller whose Sequence asks something first and then decides checks can answer at once, when
// ok, what the sequence would end with: its asks take nothing, so not asking them changes
// nothing.
func (l *Limiter) KnownFull(checks ...Check) (Decision, bool) {
	d, ok := l.refuseCached(l.keysOf(checks), checks, l.clock())
	if ok {
		l.stats.denyCached.Add(1)
	}
	return d, ok
}

// runSequence runs sequenceScript over the steps, within the budget, and decodes the replies of
// the steps that ran.
func (l *Limiter) runSequence(ctx context.Context, steps []Step, keys [][]string) ([]Decision, error) {
	calls := make([]call, len(steps))
	args := []any{len(steps)}
	var flat []string
	for i, s := range steps {
		calls[i] = l.newCall(s.checks[0].Policy.algorithm(), s.op, s.checks)
		switch {
		case s.voucher:
			calls[i].id = requestID() // a grant's name
		case s.slot != "":
			calls[i].id = s.slot
		}
		c := calls[i]
		args = append(args, s.body(), len(s.checks), c.id, c.now, c.op.arg())
		for _, k := range c.keys {
			args = append(args, k[0], k[1], k[2])
		}
		flat = append(flat, keys[i]...)
	}
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	vals, err := sequenceScriptFor(steps).Run(ctx, l.rdb, flat, args...).Int64Slice()
	if err != nil {
		err = fmt.Errorf("%w: %w", ErrUnavailable, err)
		for i, s := range steps {
			if !s.voucher && s.slot == "" {
				l.withdrawLate(s.checks[0].Policy.algorithm(), keys[i], calls[i], s.checks, err)
			}
		}
		return nil, err
	}
	var ds []Decision
	for i, s := range steps {
		queued := !s.voucher && s.slot == "" && s.checks[0].Policy.algorithm() == LeakyBucket
		size := replySize(len(s.checks), queued)
		if len(vals) == 0 {
			break
		}
		if len(vals) < size {
			return nil, fmt.Errorf("%w: sequence replied %d values for step %d of %d keys", ErrUnavailable, len(vals), i+1, len(s.checks))
		}
		r, err := parseReply(vals[:size], len(s.checks), queued)
		if err != nil {
			return nil, err
		}
		ds = append(ds, l.decisionOf(r, s.checks, keys[i], calls[i]))
		vals = vals[size:]
	}
	return ds, nil
}

// sequenceApart is Sequence on a cluster: each step its own call, as the lone call would be.
func (l *Limiter) sequenceApart(ctx context.Context, steps []Step) ([]Decision, error) {
	var ds []Decision
	for _, s := range steps {
		var d Decision
		var err error
		if s.voucher {
			var ok bool
			ok, err = l.voucher(ctx, s.checks[0], s.op)
			d = Decision{Allowed: ok}
		} else if s.slot != "" {
			d, err = l.slotCall(ctx, s.checks[0], s.slot, s.op)
		} else if s.op.kind == opRefund {
			d, err = l.Refund(ctx, s.op.n, s.checks...)
		} else {
			d, err = l.do(ctx, s.op, s.checks)
		}
		if err != nil {
			return ds, err
		}
		ds = append(ds, d)
		if !d.Allowed {
			break
		}
	}
	return ds, nil
}
