package ratelimit

import "fmt"

// Algorithm is how a policy counts. Every algorithm is one Lua script beside this file, decides
// one or several keys atomically with the Redis clock, never records a refused request, can
// withdraw an admission, and reports the same Result; they differ in memory, accuracy and what
// bursts they let through (see the package documentation).
type Algorithm string

// The algorithms.
const (
	// SlidingLog keeps one entry per admitted request: exact, no boundary burst, and an
	// admission can be withdrawn by its request id; memory grows with the limit. The default.
	SlidingLog Algorithm = "sliding_log"
	// SlidingLogPacked is SlidingLog's exact log, deciding identically while Redis's clock goes
	// forward (TestPackedLogDecidesAsTheSortedSet; after a step back it records at its newest
	// entry's time, so it admits no more than before the step, where the sorted set may admit
	// one more per admission scored behind), packed into one string of 4-byte admission times per
	// key: a decision is one GET and one SET whatever the limit, and a key costs a few bytes per
	// admission instead of a sorted-set entry. No request ids: a late decision cannot be
	// withdrawn (it stays counted, as with the counters). Windows up to 28 minutes; its TTL is
	// renewed once a quarter of a window, so a key may outlive its log by that much.
	SlidingLogPacked Algorithm = "sliding_log_packed"
	// SlidingWindow weighs the previous calendar window's count by how much of it the sliding
	// window still covers: two counters, no boundary burst for the classic attack, approximate:
	// up to twice the limit when the previous window's traffic sat at its very end
	// (TestSlidingWindowErrorBound), exact when it was spread evenly.
	SlidingWindow Algorithm = "sliding_window"
	// FixedWindow counts per calendar window: one counter, and up to twice the limit across a
	// window boundary (TestBoundaryBursts).
	FixedWindow Algorithm = "fixed_window"
	// TokenBucket refills Limit tokens per Window, continuously, up to Burst: bursts of Burst,
	// then the refill rate.
	TokenBucket Algorithm = "token_bucket"
	// GCRA is the leaky bucket as a meter: the decisions of a token bucket of the same Burst and
	// rate, from one number of state.
	GCRA Algorithm = "gcra"
	// LeakyBucket is the leaky bucket as a queue: one request leaves every Window / Limit, and
	// up to Queue wait for their turns, each holding a place of its own; past that, refused. An
	// admission comes with a Wait, and the caller holds the request until its turn (package queue).
	// One key per decision; a place per waiter in a sorted set.
	LeakyBucket Algorithm = "leaky_bucket"
)

// Algorithms lists every algorithm, the default first, the queue last.
func Algorithms() []Algorithm {
	return []Algorithm{SlidingLog, SlidingLogPacked, SlidingWindow, FixedWindow, TokenBucket, GCRA, LeakyBucket}
}

// UnmarshalText parses an algorithm's name; "" is SlidingLog.
func (a *Algorithm) UnmarshalText(text []byte) error {
	if len(text) == 0 {
		*a = SlidingLog
		return nil
	}
	if _, ok := scripts[Algorithm(text)]; !ok {
		return fmt.Errorf("want one of %v", Algorithms())
	}
	*a = Algorithm(text)
	return nil
}

// keyTag names the algorithm in its keys. The packed log, whose point is a small key, takes two
// letters ("log, packed"): Redis keeps the name for every identity, and at limit 10 the name
// weighs about as much as the log.
func (a Algorithm) keyTag() string {
	if a == SlidingLogPacked {
		return "lp"
	}
	return string(a)
}

// Bursty reports whether the algorithm takes a Burst: a capacity distinct from the rate.
func (a Algorithm) Bursty() bool { return a == TokenBucket || a == GCRA }
