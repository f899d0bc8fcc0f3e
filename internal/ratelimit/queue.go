package ratelimit

import (
	"fmt"
	"math"
	"slices"
)

// The leaky bucket as a queue (LeakyBucket, leaky_bucket.lua): a decision that finds a place
// comes back admitted with a Wait and its Place, and its caller holds the request until its turn
// (package queue). This file holds what the algorithm itself needs: the place, and the queue's
// statement in Go (MemoryQueue) that the script is tested against and a fallback runs in memory.

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

// paceOf is p's pace: the time between two turns, µs.
func paceOf(p Policy) float64 {
	return float64(p.Window.Microseconds()) / float64(p.Limit)
}

// MemoryQueue is one queue's places in memory, decided as leaky_bucket.lua decides them in
// Redis: the statement the script is tested against, and what an outage fallback runs (package
// fallback). Not safe for concurrent use.
type MemoryQueue struct {
	turns []float64 // ascending
	ids   []string
}

// Take decides one request named id at now (µs) on a queue of p (its pace, and p.Queue places):
// with record, it takes its place when admitted; maxWait < 0 waits as long as the queue. It
// returns what the script replies.
func (q *MemoryQueue) Take(now int64, p Policy, maxWait int64, id string, record bool) (admitted bool, remaining, reset, wait int64) {
	pace, places := paceOf(p), p.Queue
	t := float64(now)
	cut := 0
	for cut < len(q.turns) && q.turns[cut] <= t-pace {
		cut++
	}
	q.turns, q.ids = q.turns[cut:], q.ids[cut:]
	turn := t
	if len(q.turns) > 0 {
		turn = math.Max(t, q.turns[len(q.turns)-1]+pace)
	}
	waiting := 0
	for _, x := range q.turns {
		if x > t {
			waiting++
		}
	}
	room := waiting < places
	fits := maxWait < 0 || turn-t <= float64(maxWait)
	admitted = room && fits
	if admitted && record {
		q.turns, q.ids = append(q.turns, turn), append(q.ids, id)
		if turn > t {
			waiting++
		}
	}
	for _, x := range q.turns {
		if x > t {
			reset = int64(math.Ceil(x - t))
			break
		}
	}
	if !admitted && !fits && room {
		reset = int64(math.Ceil(turn - t - float64(maxWait)))
	}
	if admitted {
		remaining = int64(max(0, places-waiting))
		wait = int64(math.Ceil(turn - t))
	}
	return admitted, remaining, reset, wait
}

// Leave gives id's place back at now (µs) on a queue of p and moves the turns after it up, as
// the script does; it returns the place's turn and how far the others moved (µs), or 0, 0 when
// it was not there.
func (q *MemoryQueue) Leave(now int64, p Policy, id string) (turn, moved int64) {
	pace := paceOf(p)
	i := slices.Index(q.ids, id)
	if i < 0 {
		return 0, 0
	}
	t := q.turns[i]
	q.turns, q.ids = slices.Delete(q.turns, i, i+1), slices.Delete(q.ids, i, i+1)
	first := float64(now)
	if i > 0 {
		first = math.Max(q.turns[i-1]+pace, float64(now))
	}
	var by float64
	if i < len(q.turns) {
		by = math.Max(0, q.turns[i]-first)
	}
	if by > 0 {
		for j := i; j < len(q.turns); j++ {
			q.turns[j] -= by
		}
	}
	return int64(math.Ceil(t)), int64(math.Floor(by))
}

// Served says whether every place of the queue is served at now (µs): nobody waits.
func (q *MemoryQueue) Served(now int64) bool {
	return len(q.turns) == 0 || q.turns[len(q.turns)-1] <= float64(now)
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
