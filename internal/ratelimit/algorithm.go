package ratelimit

import (
	_ "embed"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// Algorithm is how a policy counts. Every algorithm is one Lua script beside this file, decides
// one or several keys atomically with the Redis clock, never records a refused request, and
// reports the same Result; they differ in memory, accuracy and what bursts they let through. The
// package documentation compares them with measured figures.
type Algorithm string

// The algorithms.
const (
	// SlidingLog keeps one entry per admitted request: exact, no boundary burst, the only one
	// that recognizes a retried request; memory grows with the limit. The default.
	SlidingLog Algorithm = "sliding_log"
	// SlidingWindow weighs the previous calendar window's count by how much of it the sliding
	// window still covers: two counters, no boundary burst for the classic attack, approximate.
	SlidingWindow Algorithm = "sliding_window"
	// FixedWindow counts per calendar window: one counter, and up to twice the limit across a
	// window boundary.
	FixedWindow Algorithm = "fixed_window"
	// TokenBucket refills Limit tokens per Window, continuously, up to Burst: bursts of Burst,
	// then the refill rate.
	TokenBucket Algorithm = "token_bucket"
	// GCRA is the leaky bucket as a meter: the decisions of a token bucket of the same Burst and
	// rate, from one number of state.
	GCRA Algorithm = "gcra"
)

// Algorithms lists every algorithm, the default first.
var Algorithms = []Algorithm{SlidingLog, SlidingWindow, FixedWindow, TokenBucket, GCRA}

var (
	//go:embed sliding_log.lua
	slidingLogLua string
	//go:embed sliding_window.lua
	slidingWindowLua string
	//go:embed fixed_window.lua
	fixedWindowLua string
	//go:embed token_bucket.lua
	tokenBucketLua string
	//go:embed gcra.lua
	gcraLua string
)

// scripts run with EVALSHA and fall back to EVAL on NOSCRIPT (redis.Script.Run), so after the
// first call on a server only a script's hash travels.
var scripts = map[Algorithm]*redis.Script{
	SlidingLog:    redis.NewScript(slidingLogLua),
	SlidingWindow: redis.NewScript(slidingWindowLua),
	FixedWindow:   redis.NewScript(fixedWindowLua),
	TokenBucket:   redis.NewScript(tokenBucketLua),
	GCRA:          redis.NewScript(gcraLua),
}

// ParseAlgorithm parses an algorithm's name; "" is SlidingLog.
func ParseAlgorithm(s string) (Algorithm, error) {
	if s == "" {
		return SlidingLog, nil
	}
	a := Algorithm(s)
	if _, ok := scripts[a]; !ok {
		return "", fmt.Errorf("algorithm %q: want one of %v", s, Algorithms)
	}
	return a, nil
}

// bursty reports whether the algorithm takes a Burst: a capacity distinct from the rate.
func (a Algorithm) bursty() bool { return a == TokenBucket || a == GCRA }
