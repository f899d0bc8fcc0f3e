package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"slices"
)

// A Step is one decision of Decide. Each kind is a type of its own, which knows its checks, its
// operation and its body in a sequence's script: an algorithm's decision (decideStep), a
// voucher's (voucherStep) and an in-flight slot's (slotStep). Decide's Decisions are read by
// the step that asked (Decisions.Of): keep the step to read its decision.
type Step interface {
	// Checks are the step's checks, in order.
	Checks() []Check
	operation() Op
	// body is the number of the step's body in a sequence's script (sequence.lua calls
	// decisions[body]): an algorithm's place in Algorithms(), from 1, then the voucher's and
	// the slots'.
	body() int
	// Cacheable says whether a refusal of the step says its keys are full until their Reset,
	// as an algorithm's does (what a deny cache may remember, package denycache): a voucher with
	// no grant and a held slot are no full key, and a refund is never refused.
	Cacheable() bool
	// Refunds says whether the step gives tokens back (RefundStep): room its keys had not.
	Refunds() bool
	// Queues says whether the step takes a place in a queue (an AllowStep of a LeakyBucket
	// policy): its caller then holds the request until its turn (package queue).
	Queues() bool
	validate() error
	// with is a copy of the step doing o (a queue's decision, once its deadline is known).
	with(o Op) Step
}

// decideStep is an algorithm's decision over its checks: AllowStep, AskStep, ChargeStep or
// RefundStep.
type decideStep struct {
	cs     []Check
	op     Op
	tokens bool // a charge or a refund: token_bucket policies only
}

// voucherStep is a voucher's: RedeemStep or GrantStep of its check's key.
type voucherStep struct {
	c  Check
	op Op
}

// slotStep is an in-flight slot's: HoldStep (or its ask) or ReleaseStep of its check's key, for
// holder.
type slotStep struct {
	c      Check
	holder string
	op     Op
}

// AllowStep is AllowAll(checks...) as a step.
func AllowStep(checks ...Check) Step { return &decideStep{cs: checks, op: Op{kind: opDecide}} }

// AskStep asks whether a request would be admitted by every check, taking nothing, for any
// algorithm: the keys' state (Remaining, Reset) as a decision sees it, and which key is full. A
// request that must pass several buckets (a key look-up: the payer's and the bank's) asks them
// together before it does its work, then pays each its own price (ChargeStep); a support desk
// reads a key's state with it. A sequence goes on past it only if it would admit.
func AskStep(checks ...Check) Step { return &decideStep{cs: checks, op: Op{kind: opAsk}} }

// ChargeStep decides one request of c that costs n tokens of a TokenBucket policy: it is admitted
// while the bucket holds at least one token, as any request, and then takes all n at once, even
// into debt (the bucket then refuses until its refill has paid the debt back). n = 0 asks
// (AskStep); n = 1 is AllowStep.
//
// A request whose price depends on its answer (a PIX key look-up: 1 if the key exists, 20 if
// not) asks before it does the work, so that a refused one costs nothing more, and pays its price
// with ChargeStep once it knows it, before it answers: each answer is then admitted and paid in
// one atomic step, and requests sent together can never buy more answers than the same requests
// one by one (as they could if each passed a one-token check and paid the rest after answering).
func ChargeStep(c Check, n int) Step { return &decideStep{cs: []Check{c}, op: cost(n), tokens: true} }

// RefundStep gives n tokens (1 or more) back to each check's TokenBucket bucket, never above
// their capacities: a price paid for something that turned out to be worth it (DICT gives back
// the token of a key look-up that a payment followed). It is never refused; a deny cache
// (package denycache) forgets the keys here, and another replica's may refuse on the strict side
// for at most its hold, never admit one too many.
func RefundStep(n int, checks ...Check) Step {
	return &decideStep{cs: checks, op: Op{kind: opRefund, n: n}, tokens: true}
}

// GrantStep records, for c's key, a voucher a later request may redeem once within
// c.Policy.Window: a look-up that a payment will turn into a refund. The key holds at most
// c.Policy.Limit vouchers (the oldest are dropped past it). It is never refused. Vouchers bypass
// the deny cache (a key with no voucher is no full key) and count in no outage (a voucher that
// cannot be reached only costs a refund).
func GrantStep(c Check) Step { return &voucherStep{c: c, op: Op{kind: opGrant}} }

// RedeemStep takes one of the vouchers of c's key granted within c.Policy.Window: admitted when it
// took one, refused (ending the sequence) when there was none. Each is redeemed once,
// fleet-wide: two replicas redeeming at once take two or one and nothing.
func RedeemStep(c Check) Step { return &voucherStep{c: c, op: Op{kind: opDecide}} }

// Holder names one request's hold on the slot called name (a PIX's Idempotency-Key, of
// [A-Za-z0-9_-]): requests of one name share one slot, each with a hold of its own, so that each
// gives back only its own.
func Holder(name string) string { return name + ":" + requestID() }

// HoldStep takes one of c's in-flight slots (c.Policy.Limit of them, each a lease of
// c.Policy.Window) for a request about to start, as holder (Holder): refused while every slot is
// held by other requests. A request whose slot's name is already held (a replay of a request still
// in progress) shares it, never refused. The caller gives its hold back with ReleaseStep when the
// request ends; the slot is free once every hold on it is given back or has outlived its lease
// (its replica died). Slots bypass the deny cache: they free when requests end, which no Reset
// foretells.
func HoldStep(c Check, holder string) Step {
	return &slotStep{c: c, holder: holder, op: Op{kind: opDecide}}
}

// AskHoldStep asks whether HoldStep(c, holder) would take its slot, taking nothing: a PIX asks
// before its own limit decides and takes the slot after it, in one call, so that neither a
// refused limit holds a slot nor a full slot records a PIX.
func AskHoldStep(c Check, holder string) Step {
	return &slotStep{c: c, holder: holder, op: Op{kind: opAsk}}
}

// ReleaseStep gives back holder's hold of c's key (HoldStep). It is never refused; when Redis does
// not answer, the hold ends with its lease.
func ReleaseStep(c Check, holder string) Step {
	return &slotStep{c: c, holder: holder, op: Op{kind: opWithdraw}}
}

func (s *decideStep) Checks() []Check  { return s.cs }
func (s *voucherStep) Checks() []Check { return []Check{s.c} }
func (s *slotStep) Checks() []Check    { return []Check{s.c} }

func (s *decideStep) operation() Op  { return s.op }
func (s *voucherStep) operation() Op { return s.op }
func (s *slotStep) operation() Op    { return s.op }

func (s *decideStep) body() int  { return bodyOf(s.cs[0].Policy.algorithm()) }
func (s *voucherStep) body() int { return voucherBody }
func (s *slotStep) body() int    { return slotBody }

func (s *decideStep) Cacheable() bool  { return s.op.kind != opRefund }
func (s *voucherStep) Cacheable() bool { return false }
func (s *slotStep) Cacheable() bool    { return false }

func (s *decideStep) Refunds() bool  { return s.op.kind == opRefund }
func (s *voucherStep) Refunds() bool { return false }
func (s *slotStep) Refunds() bool    { return false }

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

func (s *decideStep) Queues() bool  { return queued(s.cs) && s.op.kind == opDecide }
func (s *voucherStep) Queues() bool { return false }
func (s *slotStep) Queues() bool    { return false }

// queuedReply says whether s's reply is a queue's (with its wait).
func queuedReply(s Step) bool {
	d, ok := s.(*decideStep)
	return ok && d.cs[0].Policy.algorithm() == LeakyBucket
}

// Decisions are what Decide decided: each step's decision, read by the step that asked for
// it. The steps after a refusal did not run.
type Decisions struct {
	steps []Step
	ds    []Decision
}

// DecisionsOf are the Decisions of steps of which the first len(ds) ran, deciding ds: what a
// layer that answers steps itself returns (package denycache's refusal of the first).
func DecisionsOf(steps []Step, ds ...Decision) Decisions { return Decisions{steps: steps, ds: ds} }

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

// Decide decides steps one after another, as each decided alone in that order would, and stops
// at the first that refuses: AllowStep is what AllowAll decides, AskStep asks without taking,
// ChargeStep takes n tokens, RefundStep gives them back, GrantStep and RedeemStep keep and take a
// voucher, HoldStep and ReleaseStep take and give back an in-flight slot. Its Decisions hold the
// decision of each step that ran, read by the step (Decisions.Of): not every step ran when one
// refused, and the last that ran (Decisions.Last) is that refusal. A PIX asks its look-up buckets,
// then decides its own limit, in one Decide: a refused ask records nothing anywhere.
//
// One step is one call, as AllowAll's. Several steps on one Redis are one script call
// (sequence.lua), atomic: nothing comes between them. On a cluster, whose keys live apart, each
// step is its own call, so a sequence costs a call per step run.
//
// Price: several steps are never batched, and count once in Stats.Redis. The error wraps
// ErrUnavailable when Redis did not answer. On one Redis none of the steps is then known to have
// run, and the sliding log's admissions among them are withdrawn when the Limiter's Runner
// withdraws (LateWithdrawer: package withdraw's); on a cluster the decisions returned with the
// error are of the steps that ran before the one that failed.
func (l *Limiter) Decide(ctx context.Context, steps ...Step) (Decisions, error) {
	ds, err := l.sequence(ctx, steps)
	return Decisions{steps: steps, ds: ds}, err
}

// sequence is Decide's decisions, in the steps' order.
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
		all = append(all, s.Checks()...)
		if s.Queues() {
			steps[i] = s.with(l.queueOp(ctx, s.operation()))
		}
	}
	if l.cluster || len(steps) == 1 {
		return l.apart(ctx, steps)
	}
	keys := make([][]string, len(steps))
	for i, s := range steps {
		keys[i] = l.keysOf(s.Checks())
	}
	l.stats.redis.Add(1)
	ds, err := l.runSequence(ctx, steps, keys)
	l.called(ctx, err, all)
	return ds, err
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
		args = append(args, s.body(), len(s.Checks()), c.ID, c.NowArg(), c.Op.Arg())
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
					w.WithdrawLate(s.Checks()[0].Policy.algorithm(), keys[i], calls[i], err)
				}
			}
		}
		return nil, err
	}
	var ds []Decision
	for i, s := range steps {
		queued := queuedReply(s)
		size := ReplySize(len(s.Checks()), queued)
		if len(vals) == 0 {
			break
		}
		if len(vals) < size {
			return nil, fmt.Errorf("%w: sequence replied %d values for step %d of %d keys", ErrUnavailable, len(vals), i+1, len(s.Checks()))
		}
		r, err := ParseReply(vals[:size], len(s.Checks()), queued)
		if err != nil {
			return nil, err
		}
		ds = append(ds, l.decisionOf(r, s.Checks(), keys[i], calls[i]))
		vals = vals[size:]
	}
	return ds, nil
}

// stepCall is a step's script arguments: its algorithm's call (newCall), named by what the step
// holds (a grant's fresh name; a slot's holder).
func (l *Limiter) stepCall(s Step) Call {
	c := l.newCall(s.Checks()[0].Policy.algorithm(), s.operation(), s.Checks())
	switch s := s.(type) {
	case *voucherStep:
		c.ID = requestID() // a grant's name
	case *slotStep:
		c.ID = s.holder
	}
	return c
}

// apart decides each step in a call of its own: one step, or a sequence on a cluster.
func (l *Limiter) apart(ctx context.Context, steps []Step) ([]Decision, error) {
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
			d, err = l.do(ctx, s.op, s.cs)
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
