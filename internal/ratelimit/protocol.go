package ratelimit

import (
	"context"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// call is one decision's script arguments as args.lua reads them (batch.lua reads the same,
// laid out per member: batchArgs; sequence.lua per step), the one place the Go side of that
// protocol is written. A lone call's arguments begin with what a person types to run the
// algorithm's script alone, and add the rest after them:
//
//	ARGV[1], [2]  the first key's limit and window in ms
//	ARGV[3]       id: the request's id (the sorted sets record it; "" for the others)
//	ARGV[4]       the first key's capacity
//	ARGV[5]       now in µs, or "" for the Redis clock (tests inject time; never production)
//	ARGV[6]       the operation (op.arg; prelude.lua's operation decodes it)
//	ARGV[3i+1..]  per key from the second: limit, window in ms, capacity
//
// A decision replies {allowed, remaining_1, reset_ms_1, ..., now, reset_µs_1, ...} (decoded by
// parseReply), and a queue's (LeakyBucket) one more value, its wait; a withdrawal, how many keys it took something
// back from (a queue's: leave).
type call struct {
	id   string   // the request's id ("" for the algorithms that record no request)
	now  int64    // the injected time in µs (tests only); 0: the Redis clock
	op   op       // what the call does
	keys [][3]any // per key, boxed once per policy (Limiter.policyArgs)
}

// nowArg is the call's now as a script reads it: "" for the Redis clock.
func (c call) nowArg() any {
	if c.now == 0 {
		return ""
	}
	return c.now
}

// op is what a script call does with its keys.
type op struct {
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
	opGrant                  // record a voucher, named by the call's id (voucher.lua)
	opQueue                  // take a place in a queue (leaky_bucket) whose turn is at most `within` away
)

// cost is the op of a request that takes n tokens: 1 is a plain decision, 0 only asks.
func cost(n int) op {
	switch n {
	case 0:
		return op{kind: opAsk}
	case 1:
		return op{kind: opDecide}
	}
	return op{kind: opCharge, n: n}
}

// takes says whether the op can admit something that a withdrawal would take back.
func (o op) takes() bool { return o.kind == opDecide || o.kind == opCharge || o.kind == opQueue }

// arg encodes the op as ARGV[3]: "" decides (the common case, sent as the least bytes), "a"
// asks, "c<n>" charges n, "r<n>" refunds n, "w<at>" withdraws, "g" grants, "q<µs>" queues.
func (o op) arg() any {
	switch o.kind {
	case opQueue:
		if o.within < 0 {
			return "" // no deadline: as long as the queue, as a plain decision
		}
		return "q" + strconv.FormatInt(o.within, 10)
	case opGrant:
		return "g"
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

// only is the call restricted to its i-th key: a cluster decides keys apart.
func (c call) only(i int) call {
	return call{id: c.id, now: c.now, op: c.op, keys: c.keys[i : i+1 : i+1]}
}

// withdrawal is the call that withdraws c's request, admitted at `at` (µs, the now its decision
// returned; 0 when unknown, for the sorted-set log that finds it by its id), at now.
func (c call) withdrawal(at, now int64) call {
	return call{id: c.id, now: now, op: op{kind: opWithdraw, at: at}, keys: c.keys}
}

// args flattens the call for redis.Script.Run.
func (c call) args() []any {
	first := c.keys[0]
	args := make([]any, 0, 3+3*len(c.keys))
	args = append(args, first[0], first[1], c.id, first[2], c.nowArg(), c.op.arg())
	for _, k := range c.keys[1:] {
		args = append(args, k[0], k[1], k[2])
	}
	return args
}

// reply is a decision's answer.
type reply struct {
	allowed bool
	pairs   []int64 // per key: remaining, reset in µs
	now     int64   // when Redis decided, in µs: a withdrawal names it
	wait    int64   // a queue's: µs from now until the request's turn
}

// run runs an algorithm's script to decide c over keys, and decodes its reply.
func run(ctx context.Context, rdb redis.Scripter, a Algorithm, keys []string, c call) (reply, error) {
	return runScript(ctx, rdb, scripts[a], a == LeakyBucket, keys, c)
}

// runScript runs script, which takes args.lua's arguments, to decide c over keys, and decodes its
// reply.
func runScript(ctx context.Context, rdb redis.Scripter, script *redis.Script, queued bool, keys []string, c call) (reply, error) {
	vals, err := script.Run(ctx, rdb, keys, c.args()...).Int64Slice()
	if err != nil {
		return reply{}, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return parseReply(vals, len(keys), queued)
}

// replySize is the length of a decision's reply over n keys; queued: a queue's, with its wait.
func replySize(n int, queued bool) int {
	if queued {
		return 3 + 3*n
	}
	return 2 + 3*n
}

// parseReply decodes {allowed, remaining_1, reset_ms_1, ..., now, reset_µs_1, ...} for n keys,
// and a queue's wait after it. The exact resets take the rounded ones' places in vals.
func parseReply(vals []int64, n int, queued bool) (reply, error) {
	if len(vals) != replySize(n, queued) {
		return reply{}, fmt.Errorf("%w: script returned %d values for %d keys", ErrUnavailable, len(vals), n)
	}
	for i := range n {
		vals[2+2*i] = vals[2+2*n+i]
	}
	r := reply{allowed: vals[0] == 1, pairs: vals[1 : 1+2*n], now: vals[1+2*n]}
	if queued {
		r.wait = vals[2+3*n]
	}
	return r, nil
}

// runWithdrawal runs the withdrawal w on key, within the budget, and returns how many keys it took
// something back from.
func (l *Limiter) runWithdrawal(a Algorithm, key string, w call) (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), l.timeout)
	defer cancel()
	return scripts[a].Run(ctx, l.rdb, []string{key}, w.args()...).Int64()
}

// clockArg is now for a call: the injected clock's time in µs, or 0 for Redis's own.
func (l *Limiter) clockArg() int64 {
	if l.now != nil {
		return l.now().UnixMicro()
	}
	return 0
}

// newCall is the call of op over checks.
func (l *Limiter) newCall(a Algorithm, o op, checks []Check) call {
	c := call{id: "", now: l.clockArg(), op: o, keys: make([][3]any, len(checks))}
	if a == SlidingLog || a == LeakyBucket {
		c.id = requestID() // only the sorted sets record the request itself
	}
	for i, ch := range checks {
		c.keys[i] = l.policyArgs(ch.Policy)
	}
	return c
}
