package ratelimit

import (
	"context"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// call is one decision's script arguments as args.lua reads them (batch.lua reads the same,
// laid out per member: batchArgs), the one place the Go side of that protocol is written:
//
//	ARGV[1]      id: the request's id (the sorted-set log records it; "" for the others)
//	ARGV[2]      now in µs, or "" for the Redis clock (tests inject time; never production)
//	ARGV[3]      mode: "" decides a request; "n<cost>" one of that cost (token_bucket); a time
//	             in µs withdraws the admission made then
//	ARGV[3i+1..] per key: limit, window in µs, capacity
//
// A decision replies {allowed, remaining_1, reset_1, ..., now} (decoded by parseReply); a
// withdrawal, how many keys it took something back from.
type call struct {
	id, now, mode any
	keys          [][3]any // per key, boxed once per policy (Limiter.policyArgs)
}

// decideMode is the mode of a request that costs n tokens (1: a plain request).
func decideMode(n int) any {
	if n == 1 {
		return ""
	}
	return "n" + strconv.Itoa(n)
}

// only is the call restricted to its i-th key: a cluster decides keys apart.
func (c call) only(i int) call {
	return call{id: c.id, now: c.now, mode: c.mode, keys: c.keys[i : i+1 : i+1]}
}

// withdrawal is the call that withdraws c's request, admitted at `at` (µs, the now its decision
// returned; 0 when unknown, for the sorted-set log that finds it by its id), at now.
func (c call) withdrawal(at int64, now any) call {
	return call{id: c.id, now: now, mode: at, keys: c.keys}
}

// args flattens the call for redis.Script.Run.
func (c call) args() []any {
	args := make([]any, 0, 3+3*len(c.keys))
	args = append(args, c.id, c.now, c.mode)
	for _, k := range c.keys {
		args = append(args, k[0], k[1], k[2])
	}
	return args
}

// reply is a decision's answer.
type reply struct {
	allowed bool
	pairs   []int64 // per key: remaining, reset in µs
	now     int64   // when Redis decided, in µs: a withdrawal names it
}

// run runs an algorithm's script to decide c over keys, and decodes its reply.
func run(ctx context.Context, rdb redis.Scripter, a Algorithm, keys []string, c call) (reply, error) {
	vals, err := scripts[a].Run(ctx, rdb, keys, c.args()...).Int64Slice()
	if err != nil {
		return reply{}, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return parseReply(vals, len(keys))
}

// parseReply decodes {allowed, remaining_1, reset_1, ..., now} for n keys.
func parseReply(vals []int64, n int) (reply, error) {
	if len(vals) != 2+2*n {
		return reply{}, fmt.Errorf("%w: script returned %d values for %d keys", ErrUnavailable, len(vals), n)
	}
	return reply{allowed: vals[0] == 1, pairs: vals[1 : len(vals)-1], now: vals[len(vals)-1]}, nil
}

// runWithdrawal runs the withdrawal w on key, within the budget, and returns how many keys it took
// something back from.
func (l *Limiter) runWithdrawal(a Algorithm, key string, w call) (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), l.timeout)
	defer cancel()
	return scripts[a].Run(ctx, l.rdb, []string{key}, w.args()...).Int64()
}

// clockArg is now for a script: the injected clock's time in µs, or "" for Redis's own.
func (l *Limiter) clockArg() any {
	if l.now != nil {
		return l.now().UnixMicro()
	}
	return ""
}

// newCall is the call of a request of checks in mode.
func (l *Limiter) newCall(a Algorithm, mode any, checks []Check) call {
	c := call{id: "", now: l.clockArg(), mode: mode, keys: make([][3]any, len(checks))}
	if a == SlidingLog {
		c.id = requestID() // only the sorted set records the request itself
	}
	for i, ch := range checks {
		c.keys[i] = l.policyArgs(ch.Policy)
	}
	return c
}
