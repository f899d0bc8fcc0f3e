package ratelimit

import (
	"context"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// Call is one decision's script arguments as args.lua reads them (batch.lua and sequence.lua, the
// same per member or step): the Go side of that protocol. They begin with what a person types to
// run the algorithm's script alone:
//
//	ARGV[1], [2]  the first key's limit and window in ms
//	ARGV[3]       id: the request's id (the sorted sets record it; "" for the others)
//	ARGV[4]       the first key's capacity
//	ARGV[5]       now in µs, or "" for the Redis clock (tests inject time; never production)
//	ARGV[6]       the operation (Op.Arg)
//	ARGV[3i+1..]  per key from the second: limit, window in ms, capacity
//
// A decision replies {allowed, remaining_1, reset_ms_1, ..., now, reset_µs_1, ...} (ParseReply),
// a queue's one more value, its wait; a withdrawal, how many keys it took something back from.
type Call struct {
	ID       string   // the request's id ("" for the algorithms that record no request)
	Now      int64    // the injected time in µs (tests only); 0: the Redis clock
	Op       Op       // what the call does
	Settings [][3]any // per key, boxed once per policy (Limiter.policyArgs)
}

// NowArg is the call's now as a script reads it: "" for the Redis clock.
func (c Call) NowArg() any {
	if c.Now == 0 {
		return ""
	}
	return c.Now
}

// Op is what a script call does with its keys.
type Op struct {
	kind opKind
	n    int   // opCharge: the tokens taken; opRefund: the tokens given back
	at   int64 // opWithdraw: when the admission was made (µs, the now its decision returned; 0 when unknown: the sorted-set log finds it by its id)
	// within is opQueue's longest wait for a turn, µs: a turn later than that is refused.
	within int64
}

type opKind uint8

const (
	opDecide   opKind = iota // admit one request, or refuse it and record nothing
	opAsk                    // answer as opDecide would, taking nothing
	opCharge                 // admit one request that takes n tokens (token_bucket), even into debt
	opRefund                 // give n tokens back, never above capacity (token_bucket); never refused
	opWithdraw               // take back the admission made at `at`
	opQueue                  // take a place in a queue (leaky_bucket) whose turn is at most `within` away
)

// cost is the op of a request that takes n tokens: 1 is a plain decision, 0 only asks.
func cost(n int) Op {
	switch n {
	case 0:
		return Op{kind: opAsk}
	case 1:
		return Op{kind: opDecide}
	}
	return Op{kind: opCharge, n: n}
}

// The operations of a layer's own step (package slots, grants), decoded by prelude.lua.
func TakeOp() Op             { return Op{kind: opDecide} }
func AskOp() Op              { return Op{kind: opAsk} }
func GiveOp(n int) Op        { return Op{kind: opRefund, n: n} }
func WithdrawOp(at int64) Op { return Op{kind: opWithdraw, at: at} }

// Takes says whether the op can admit something that a withdrawal would take back.
func (o Op) Takes() bool { return o.kind == opDecide || o.kind == opCharge || o.kind == opQueue }

// Arg encodes the op as ARGV[6] (args.lua): "" decides (the common case, sent as the least bytes), "a"
// asks, "c<n>" charges n, "r<n>" refunds (gives) n, "w<at>" withdraws, "q<µs>" queues.
func (o Op) Arg() any {
	switch o.kind {
	case opQueue:
		if o.within < 0 {
			return "" // no deadline: as long as the queue, as a plain decision
		}
		return "q" + strconv.FormatInt(o.within, 10)
	case opAsk:
		return "a"
	case opCharge:
		return "c" + strconv.Itoa(o.n)
	case opRefund:
		return "r" + strconv.Itoa(o.n)
	case opWithdraw:
		return "w" + strconv.FormatInt(o.at, 10)
	}
	return ""
}

// Withdrawal is the call that withdraws c's request, admitted at `at` (µs, the now its decision
// returned; 0 when unknown, for the sorted-set log that finds it by its id), at now.
func (c Call) Withdrawal(at, now int64) Call {
	return Call{ID: c.ID, Now: now, Op: Op{kind: opWithdraw, at: at}, Settings: c.Settings}
}

// Only is c over its i-th key alone: what a key's own script is sent where the keys of one
// request live on different Redis Cluster nodes (package withdraw's split, Limiter.Withdraw).
func (c Call) Only(i int) Call {
	c.Settings = c.Settings[i : i+1 : i+1]
	return c
}

// Args flattens the call for redis.Script.Run.
func (c Call) Args() []any {
	first := c.Settings[0]
	args := make([]any, 0, 3+3*len(c.Settings))
	args = append(args, first[0], first[1], c.ID, first[2], c.NowArg(), c.Op.Arg())
	for _, k := range c.Settings[1:] {
		args = append(args, k[0], k[1], k[2])
	}
	return args
}

// Reply is a decision's answer.
type Reply struct {
	Allowed bool
	Pairs   []int64 // per key: remaining, reset in µs
	Now     int64   // when Redis decided, in µs: a withdrawal names it
	Wait    int64   // a queue's: µs from now until the request's turn
}

// A Runner runs a decision's Call over its keys on Redis and decodes the Reply: Scripts, or a
// layer around it that sends several calls in one (package batch), each decided as it would be
// alone.
type Runner interface {
	Run(ctx context.Context, a Algorithm, keys []string, c Call) (Reply, error)
}

// Scripts is the Runner that runs each call alone, by its algorithm's script: the default.
func Scripts(rdb redis.Scripter) Runner { return scriptRunner{rdb} }

type scriptRunner struct{ rdb redis.Scripter }

func (r scriptRunner) Run(ctx context.Context, a Algorithm, keys []string, c Call) (Reply, error) {
	return runScript(ctx, r.rdb, scripts[a], a == LeakyBucket, keys, c)
}

// Script is algorithm a's script, the file a.lua (a layer's withdrawal runs it too).
func Script(a Algorithm) *redis.Script { return scripts[a] }

// NewCall is a Call that decides one request of checks by the Redis clock: a layer's or a test's
// (a Limiter's own calls box each policy's arguments once).
func NewCall(checks ...Check) Call {
	a := checks[0].Policy.algorithm()
	c := Call{Op: Op{kind: opDecide}, Settings: make([][3]any, len(checks))}
	if decideScript(a, c.Op).NewID {
		c.ID = RequestID()
	}
	for i, ch := range checks {
		c.Settings[i] = [3]any{ch.Policy.Limit, ch.Policy.Window.Milliseconds(), ch.Policy.Capacity()}
	}
	return c
}

// runScript runs script, which takes args.lua's arguments, to decide c over keys.
func runScript(ctx context.Context, rdb redis.Scripter, script *redis.Script, queued bool, keys []string, c Call) (Reply, error) {
	vals, err := script.Run(ctx, rdb, keys, c.Args()...).Int64Slice()
	if err != nil {
		return Reply{}, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return ParseReply(vals, len(keys), queued)
}

// ReplySize is the length of a decision's reply over n keys; queued: a queue's, with its wait.
func ReplySize(n int, queued bool) int {
	if queued {
		return 3 + 3*n
	}
	return 2 + 3*n
}

// ParseReply decodes {allowed, remaining_1, reset_ms_1, ..., now, reset_µs_1, ...} for n keys,
// and a queue's wait after it. The exact resets take the rounded ones' places in vals.
func ParseReply(vals []int64, n int, queued bool) (Reply, error) {
	if len(vals) != ReplySize(n, queued) {
		return Reply{}, fmt.Errorf("%w: script returned %d values for %d keys", ErrUnavailable, len(vals), n)
	}
	for i := range n {
		vals[2+2*i] = vals[2+2*n+i]
	}
	r := Reply{Allowed: vals[0] == 1, Pairs: vals[1 : 1+2*n], Now: vals[1+2*n]}
	if queued {
		r.Wait = vals[2+3*n]
	}
	return r, nil
}
