package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"slices"
)

// A Step is one decision of a Sequence: what AllowAll, AskAll, AllowN, Refund, Redeem, Grant,
// Hold or Release would decide alone. Each kind is a type of its own, which knows its checks, its
// operation and its body in a sequence's script: an algorithm's decision (decideStep), a
// voucher's (voucherStep) and an in-flight slot's (slotStep). A Sequence's Decisions are read by
// the step that asked (Decisions.Of): keep the step to read its decision.
type Step interface {
	checks() []Check
	operation() Op
	// body is the number of the step's body in a sequence's script (sequence.lua calls
	// decisions[body]): an algorithm's place in Algorithms(), from 1, then the voucher's and
	// the slots'.
	body() int
	// cached says whether the deny cache answers and learns the step, as it does AllowAll,
	// AskAll and AllowN: a voucher with no grant and a held slot are no full key, and a refund
	// is never refused.
	cached() bool
	validate() error
	// with is a copy of the step doing o (a queue's decision, once its deadline is known).
	with(o Op) Step
}

// decideStep is an algorithm's decision: AllowAll, AskAll, AllowN or Refund over its checks.
type decideStep struct {
	cs     []Check
	op     Op
	tokens bool // a charge or a refund: token_bucket policies only
}

// voucherStep is a voucher's: Redeem or Grant of its check's key.
type voucherStep struct {
	c  Check
	op Op
}

// slotStep is an in-flight slot's: Hold (or its ask) or Release of its check's key, for holder.
type slotStep struct {
	c      Check
	holder string
	op     Op
}

// AllowStep is AllowAll(checks...) as a step.
func AllowStep(checks ...Check) Step { return &decideStep{cs: checks, op: Op{kind: opDecide}} }

// AskStep is AskAll(checks...) as a step: it takes nothing, and a sequence goes on past it only
// if it would admit.
func AskStep(checks ...Check) Step { return &decideStep{cs: checks, op: Op{kind: opAsk}} }

// ChargeStep is AllowN(c, n) as a step.
func ChargeStep(c Check, n int) Step { return &decideStep{cs: []Check{c}, op: cost(n), tokens: true} }

// RefundStep is Refund(n, checks...) as a step. It is never refused.
func RefundStep(n int, checks ...Check) Step {
	return &decideStep{cs: checks, op: Op{kind: opRefund, n: n}, tokens: true}
}

// RedeemStep is Redeem(c) as a step: admitted when it took a grant, refused (ending the
// sequence) when there was none.
func RedeemStep(c Check) Step { return &voucherStep{c: c, op: Op{kind: opDecide}} }

// GrantStep is Grant(c) as a step. It is never refused.
func GrantStep(c Check) Step { return &voucherStep{c: c, op: Op{kind: opGrant}} }

// HoldStep is Hold(c, holder) as a step.
func HoldStep(c Check, holder string) Step {
	return &slotStep{c: c, holder: holder, op: Op{kind: opDecide}}
}

// AskHoldStep asks whether Hold(c, holder) would take its slot, taking nothing: a PIX asks before
// its own limit decides and takes the slot after it, in one call, so that neither a refused
// limit holds a slot nor a full slot records a PIX.
func AskHoldStep(c Check, holder string) Step {
	return &slotStep{c: c, holder: holder, op: Op{kind: opAsk}}
}

// ReleaseStep is Release(c, holder) as a step. It is never refused.
func ReleaseStep(c Check, holder string) Step {
	return &slotStep{c: c, holder: holder, op: Op{kind: opWithdraw}}
}

func (s *decideStep) checks() []Check  { return s.cs }
func (s *voucherStep) checks() []Check { return []Check{s.c} }
func (s *slotStep) checks() []Check    { return []Check{s.c} }

func (s *decideStep) operation() Op  { return s.op }
func (s *voucherStep) operation() Op { return s.op }
func (s *slotStep) operation() Op    { return s.op }

func (s *decideStep) body() int  { return bodyOf(s.cs[0].Policy.algorithm()) }
func (s *voucherStep) body() int { return voucherBody }
func (s *slotStep) body() int    { return slotBody }

func (s *decideStep) cached() bool  { return s.op.kind != opRefund }
func (s *voucherStep) cached() bool { return false }
func (s *slotStep) cached() bool    { return false }

func (s *decideStep) with(o Op) Step  { c := *s; c.op = o; return &c }
func (s *voucherStep) with(o Op) Step { c := *s; c.op = o; return &c }
func (s *slotStep) with(o Op) Step    { c := *s; c.op = o; return &c }

// validate checks what the step's lone call would check.
func (s *decideStep) validate() error {
	if len(s.cs) == 0 {
		return errors.New("ratelimit: a step needs checks")
	}
	if err := oneQueue(s.cs); err != nil {
		return err
	}
	for _, c := range s.cs {
		if s.tokens && (c.Policy.algorithm() != TokenBucket || s.op.kind == opRefund && s.op.n < 1 || s.op.n < 0) {
			return fmt.Errorf("ratelimit: %d tokens of %s: want a token_bucket policy, and 1 or more to refund", s.op.n, c.Policy.Name)
		}
	}
	return nil
}

func (s *voucherStep) validate() error { return s.c.Policy.Validate() }
func (s *slotStep) validate() error    { return s.c.Policy.Validate() }

// queuedDecision says whether s takes a place in a queue (LeakyBucket): it waits its turn.
func queuedDecision(s Step) bool {
	d, ok := s.(*decideStep)
	return ok && queued(d.cs) && d.op.kind == opDecide
}

// queuedReply says whether s's reply is a queue's (with its wait).
func queuedReply(s Step) bool {
	d, ok := s.(*decideStep)
	return ok && d.cs[0].Policy.algorithm() == LeakyBucket
}

// Decisions are what a Sequence decided: each step's decision, read by the step that asked for
// it. The steps after a refusal did not run.
type Decisions struct {
	steps []Step
	ds    []Decision
}

// Of is s's decision, and whether s ran.
func (d Decisions) Of(s Step) (Decision, bool) {
	i := slices.Index(d.steps, s)
	if i < 0 || i >= len(d.ds) {
		return Decision{}, false
	}
	return d.ds[i], true
}

// Ran is how many steps ran: all of them, or up to the first refusal.
func (d Decisions) Ran() int { return len(d.ds) }

// Last is the decision of the last step that ran: the refusal that ended the sequence, if one did.
func (d Decisions) Last() Decision {
	if len(d.ds) == 0 {
		return Decision{}
	}
	return d.ds[len(d.ds)-1]
}

// Sequence decides steps one after another, as the same calls made one by one in that order
// would (AllowAll, AskAll, AllowN, Refund, Redeem, Grant, Hold, Release), and stops at the first
// that refuses. Its Decisions hold the decision of each step that ran, read by the step
// (Decisions.Of): not every step ran when one refused, and the last that ran (Decisions.Last) is
// that refusal. A PIX asks its look-up buckets, then decides its own limit, in one Sequence: a
// refused ask records nothing anywhere.
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
// withdrawn when the Limiter's Runner withdraws (LateWithdrawer: package withdraw's); on a cluster the decisions returned with the error are of the steps that ran
// before the one that failed.
func (l *Limiter) Sequence(ctx context.Context, steps ...Step) (Decisions, error) {
	ds, err := l.sequence(ctx, steps)
	return Decisions{steps: steps, ds: ds}, err
}

// sequence is Sequence's decisions, in the steps' order.
func (l *Limiter) sequence(ctx context.Context, asked []Step) ([]Decision, error) {
	if len(asked) == 0 {
		return nil, errors.New("ratelimit: no steps")
	}
	var all []Check
	steps := slices.Clone(asked) // a queue's step is replaced by one with its deadline
	for i, s := range steps {
		if err := s.validate(); err != nil {
			return nil, err
		}
		all = append(all, s.checks()...)
		if queuedDecision(s) {
			if l.waiters.full(s.checks()[0].Identity) { // no place taken: the replica cannot hold one more
				return l.unasked(steps[:i], l.tooManyWaiting(s.checks())), nil
			}
			steps[i] = s.with(l.queueOp(ctx, s.operation()))
		}
	}
	if l.cluster {
		return l.sequenceApart(ctx, steps)
	}
	sent := l.clock()
	keys := make([][]string, len(steps))
	for i, s := range steps {
		keys[i] = l.keysOf(s.checks())
		if s.operation().kind == opRefund {
			l.forgetBlocks(keys[i]) // as Refund does
		}
	}
	if steps[0].cached() {
		if d, ok := l.refuseCached(keys[0], steps[0].checks(), sent); ok {
			l.stats.denyCached.Add(1)
			return []Decision{d}, nil
		}
	}
	l.stats.redis.Add(1)
	ds, err := l.runSequence(ctx, steps, keys)
	l.called(ctx, err, all)
	refunds := slices.ContainsFunc(steps, func(s Step) bool { return s.operation().kind == opRefund })
	for i, d := range ds {
		if steps[i].cached() && !refunds { // a refund after a full step may have made room
			l.learn(d, keys[i], steps[i].checks(), sent)
		}
	}
	return ds, err
}

// unasked are the decisions of steps that were not asked, each admitted with its keys' capacity
// as Remaining (as refuseCached reports the keys it did not ask), then last, the refusal.
func (l *Limiter) unasked(steps []Step, last Decision) []Decision {
	ds := make([]Decision, 0, len(steps)+1)
	for _, s := range steps {
		d := Decision{Allowed: true, Results: make([]Result, len(s.checks()))}
		for j, c := range s.checks() {
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
	calls := make([]Call, len(steps))
	args := []any{len(steps)}
	var flat []string
	for i, s := range steps {
		calls[i] = l.stepCall(s)
		c := calls[i]
		args = append(args, s.body(), len(s.checks()), c.ID, c.NowArg(), c.Op.Arg())
		for _, k := range c.Settings {
			args = append(args, k[0], k[1], k[2])
		}
		flat = append(flat, keys[i]...)
	}
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	vals, err := sequenceScriptFor(steps).Run(ctx, l.rdb, flat, args...).Int64Slice()
	if err != nil {
		err = fmt.Errorf("%w: %w", ErrUnavailable, err)
		if w, ok := l.runner.(LateWithdrawer); ok {
			for i, s := range steps {
				if _, ok := s.(*decideStep); ok {
					w.WithdrawLate(s.checks()[0].Policy.algorithm(), keys[i], calls[i], err)
				}
			}
		}
		return nil, err
	}
	var ds []Decision
	for i, s := range steps {
		queued := queuedReply(s)
		size := ReplySize(len(s.checks()), queued)
		if len(vals) == 0 {
			break
		}
		if len(vals) < size {
			return nil, fmt.Errorf("%w: sequence replied %d values for step %d of %d keys", ErrUnavailable, len(vals), i+1, len(s.checks()))
		}
		r, err := ParseReply(vals[:size], len(s.checks()), queued)
		if err != nil {
			return nil, err
		}
		ds = append(ds, l.decisionOf(r, s.checks(), keys[i], calls[i]))
		vals = vals[size:]
	}
	return ds, nil
}

// stepCall is a step's script arguments: its algorithm's call (newCall), named by what the step
// holds (a grant's fresh name; a slot's holder).
func (l *Limiter) stepCall(s Step) Call {
	c := l.newCall(s.checks()[0].Policy.algorithm(), s.operation(), s.checks())
	switch s := s.(type) {
	case *voucherStep:
		c.ID = requestID() // a grant's name
	case *slotStep:
		c.ID = s.holder
	}
	return c
}

// sequenceApart is Sequence on a cluster: each step its own call, as the lone call would be.
func (l *Limiter) sequenceApart(ctx context.Context, steps []Step) ([]Decision, error) {
	var ds []Decision
	for _, s := range steps {
		var d Decision
		var err error
		switch s := s.(type) {
		case *voucherStep:
			var ok bool
			ok, err = l.voucher(ctx, s.c, s.op)
			d = Decision{Allowed: ok}
		case *slotStep:
			d, err = l.slotCall(ctx, s.c, s.holder, s.op)
		case *decideStep:
			if s.op.kind == opRefund {
				d, err = l.Refund(ctx, s.op.n, s.cs...)
			} else {
				d, err = l.do(ctx, s.op, s.cs)
			}
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
