package ratelimit

import (
	"fmt"
	"slices"
)

// The leaky bucket as a queue (LeakyBucket, leaky_bucket.lua): a decision that finds a place
// comes back admitted with a Wait and its Place, and its caller holds the request until its turn
// (package queue). This file holds what the core needs of it: the place. The queue's statement
// in Go, which the script is tested against, is the outage fallback's (package fallback's
// memoryQueue), which runs it in memory.

// Place is an admitted queue decision's place, for the caller that holds the request until its
// turn (package queue) and gives the place back if it leaves first.
type Place struct {
	Key     string
	Owner   string // its identity (an account): whose share of a replica's waiters it takes
	ID      string // its request's id in the queue, which a leave names
	Turn    int64  // when its turn comes, µs on the clock that decided it
	Decided int64  // when its turn was given, µs on the same clock: a move made after it is already counted in it
	Policy  Policy
	// Leave, when set, gives back a place held in a replica's memory (an outage fallback's),
	// returning its turn, how far the turns after it moved (µs) and the time it left (µs);
	// a place in Redis is given back by leaky_bucket.lua.
	Leave func() (turn, moved, at int64)
}

// queued says whether checks decide a queue.
func queued(checks []Check) bool { return checks[0].Policy.algorithm() == LeakyBucket }

// oneQueue refuses a queue decided together with other keys: each queue gives its own turn.
func oneQueue(checks []Check) error {
	if len(checks) > 1 && slices.ContainsFunc(checks, func(c Check) bool { return c.Policy.algorithm() == LeakyBucket }) {
		return fmt.Errorf("ratelimit: a leaky_bucket policy decides one key at a time, not %d", len(checks))
	}
	return nil
}
