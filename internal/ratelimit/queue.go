package ratelimit

import (
	"fmt"
	"slices"
)

// Place is an admitted queue decision's place (LeakyBucket, leaky_bucket.lua), for the caller
// that holds the request until its turn (package queue) and gives the place back if it leaves
// first. The queue's model in Go is the outage fallback's memoryQueue, which runs it in memory.
type Place struct {
	Key     string
	Owner   string // its identity (an account): whose share of a replica's waiters it takes
	ID      string // its request's id in the queue, which a leave names
	Turn    int64  // when its turn comes, µs on the clock that decided it
	Decided int64  // when its turn was given, µs on the same clock: a move made after it is already counted in it
	Policy  Policy
	// Leave, when set, gives back a place held in a replica's memory (the outage fallback's),
	// returning its turn, how far the turns after it moved and when it left (µs).
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
