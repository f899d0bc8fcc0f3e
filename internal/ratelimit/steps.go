package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/redis/go-redis/v9"
)

// A Step is one decision of Decide: an algorithm's (AllowStep, AskStep, ChargeStep,
// RefundStep) or a layer's (package slots', grants'), a type that knows its checks and how it
// runs. Its decision is read by the step (Decisions.Of): keep it.
type Step interface {
	// Checks are the step's checks, in order.
	Checks() []Check
	// Script is how the step runs, and what a layer in front of the Limiter reads of it.
	Script() StepScript
}

// A StepScript is how a step runs on Redis: alone by Alone, or as the body lua/<Body>.lua of a
// sequence's script (package sequence), with its call's ID and Op (the Limiter adds the time and
// each key's policy); and what a layer in front of the Limiter reads of it.
type StepScript struct {
	Body   string        // the body's name: an algorithm's, "slots", "voucher"
	Alone  *redis.Script // runs the step alone (an algorithm's goes by the Runner)
	Queued bool          // its reply holds a queue's wait (LeakyBucket)
	ID     string        // the call's id ("" for the algorithms that record no request)
	NewID  bool          // a fresh id per call (RequestID): the request's, a grant's name

	Op        Op   // what the call does
	Cacheable bool // a refusal means full keys until their Reset (what package denycache keeps)
	Refunds   bool // it gives tokens back (RefundStep): room its keys had not
	Queues    bool // it takes a place in a queue, held until its turn (package queue)
}

// decideStep is an algorithm's decision over its checks: AllowStep, AskStep, ChargeStep or
// RefundStep.
type decideStep struct {
	cs     []Check
	op     Op
	tokens bool // a charge or a refund: token_bucket policies only
}

// AllowStep is AllowAll(checks...) as a step.
func AllowStep(checks ...Check) Step { return &decideStep{cs: checks, op: Op{kind: opDecide}} }

// AskStep asks whether a request would be admitted by every check, taking nothing: the keys'
// state as a decision sees it, and which key is full (a request that must pass several buckets
// asks them before its work, then pays each its price with ChargeStep). A sequence goes on past
// it only if it would admit.
func AskStep(checks ...Check) Step { return &decideStep{cs: checks, op: Op{kind: opAsk}} }

// ChargeStep decides one request of c that costs n tokens of a TokenBucket policy: admitted while
// the bucket holds a token, it takes all n at once, even into debt (refusing until the refill has
// paid it back). n = 0 asks (AskStep); n = 1 is AllowStep. A request whose price depends on its
// answer (a PIX key look-up: 1 if the key exists, 20 if not) pays with it before it answers, so
// requests sent together never buy more answers than the same requests one by one.
func ChargeStep(c Check, n int) Step { return &decideStep{cs: []Check{c}, op: cost(n), tokens: true} }

// RefundStep gives n tokens (1 or more) back to each check's TokenBucket bucket, never above its
// capacity: a price paid for something worth it (a look-up a payment followed). Never refused.
func RefundStep(n int, checks ...Check) Step {
	return &decideStep{cs: checks, op: Op{kind: opRefund, n: n}, tokens: true}
}

func (s *decideStep) Checks() []Check { return s.cs }

func (s *decideStep) Script() StepScript { return decideScript(s.cs[0].Policy.algorithm(), s.op) }

// decideScript is how algorithm a's script runs op.
func decideScript(a Algorithm, o Op) StepScript {
	return StepScript{Body: string(a), Alone: scripts[a], Queued: a == LeakyBucket, Op: o,
		NewID:     a == SlidingLog || a == LeakyBucket, // only the sorted sets record the request itself
		Cacheable: o.kind != opRefund, Refunds: o.kind == opRefund, Queues: a == LeakyBucket && o.kind == opDecide}
}

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
// at the first that refuses (Decisions.Last). Each step is a call of its own (an algorithm's by
// the Runner, batched), so another request may come between two; with Options.Sequences
// (package sequence) several steps are one atomic script call instead, except on a cluster.
//
// The error wraps ErrUnavailable when Redis did not answer; the decisions returned with it are
// of the steps that ran before (package withdraw's Runner, and its Sequences around
// Options.Sequences, take back what a failed call may have admitted).
func (l *Limiter) Decide(ctx context.Context, steps ...Step) (Decisions, error) {
	if len(steps) == 0 {
		return Decisions{}, errors.New("ratelimit: no steps")
	}
	for _, s := range steps {
		if err := validate(s); err != nil {
			return Decisions{}, err
		}
	}
	if l.sequences != nil && !l.cluster && len(steps) > 1 {
		return l.sequence(ctx, steps)
	}
	var ds []Decision
	for _, s := range steps {
		_, byRunner := s.(*decideStep)
		d, err := l.one(ctx, s.Checks(), s.Script(), byRunner)
		if err != nil {
			return Decisions{steps, ds}, err
		}
		if ds = append(ds, d); !d.Allowed {
			break
		}
	}
	return Decisions{steps, ds}, nil
}

// Atomic says whether a Decide of several steps is one atomic script call: with
// Options.Sequences, and not on a cluster, where each step is a call of its own and another
// request may come between two (a caller lays its steps out so that no interleaving spends
// what a later refusal should not have).
func (l *Limiter) Atomic() bool { return l.sequences != nil && !l.cluster }

// validate checks a step's policies, and what an algorithm's step's lone call would check.
func validate(s Step) error {
	if a, ok := s.(*decideStep); ok {
		return a.validate()
	}
	for _, c := range s.Checks() {
		if err := c.Policy.Validate(); err != nil {
			return err
		}
	}
	return nil
}

// A StepCall is one step of a sequence as its script reads it: its body, its keys and its call.
type StepCall struct {
	Body   string
	Queued bool // its reply holds a queue's wait
	Keys   []string
	Call   Call
}

// A SequenceRunner runs several steps in one script call, one after another, stopping after
// the first that refuses, and replies for each that ran (package sequence): what Decide sends
// when Options.Sequences is set. Its error wraps ErrUnavailable when Redis did not answer.
type SequenceRunner interface {
	RunSequence(ctx context.Context, steps []StepCall) ([]Reply, error)
}

// stepCall is the call of a step over checks that runs as st says: at the Limiter's time, over
// each check's key with its policy.
func (l *Limiter) stepCall(ctx context.Context, checks []Check, st StepScript) StepCall {
	c := Call{ID: st.ID, Op: st.Op, Settings: make([][3]any, len(checks))}
	keys := make([]string, len(checks))
	if l.now != nil {
		c.Now = l.now().UnixMicro() // else 0: the Redis clock
	}
	if st.NewID {
		c.ID = RequestID()
	}
	if st.Queues {
		c.Op = l.queueOp(ctx)
	}
	for i, ch := range checks {
		c.Settings[i], keys[i] = l.policyArgs(ch.Policy), l.keys.key(ch.Policy, ch.Identity)
	}
	return StepCall{Body: st.Body, Queued: st.Queued, Keys: keys, Call: c}
}

// sequence decides steps in one call of the SequenceRunner, within the budget.
func (l *Limiter) sequence(ctx context.Context, steps []Step) (Decisions, error) {
	calls := make([]StepCall, len(steps))
	for i, s := range steps {
		calls[i] = l.stepCall(ctx, s.Checks(), s.Script())
	}
	l.redisCalls.Add(1)
	budget, cancel := context.WithTimeout(ctx, l.timeout)
	replies, err := l.sequences.RunSequence(budget, calls)
	cancel()
	l.called(ctx, err)
	if err != nil {
		return Decisions{steps: steps}, err
	}
	ds := make([]Decision, len(replies))
	for i, r := range replies {
		ds[i] = decisionOf(r, steps[i].Checks(), calls[i].Keys, calls[i].Call)
	}
	return Decisions{steps, ds}, nil
}
