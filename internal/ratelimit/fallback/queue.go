package fallback

import (
	"math"
	"slices"

	"github.com/pixlimit/pixlimit/internal/ratelimit"
)

// paceOf is p's pace: the time between two turns, µs.
func paceOf(p ratelimit.Policy) float64 {
	return float64(p.Window.Microseconds()) / float64(p.Limit)
}

// memoryQueue is one queue's places in memory, decided as leaky_bucket.lua decides them in
// Redis: what the fallback runs for a LeakyBucket policy, and the statement the script is tested
// against (TestQueueScriptMatchesItsModel). Not safe for concurrent use.
type memoryQueue struct {
	turns []float64 // ascending
	ids   []string
}

// Take decides one request named id at now (µs) on a queue of p (its pace, and p.Queue places):
// with record, it takes its place when admitted; maxWait < 0 waits as long as the queue. It
// returns what the script replies.
func (q *memoryQueue) Take(now int64, p ratelimit.Policy, maxWait int64, id string, record bool) (admitted bool, remaining, reset, wait int64) {
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
func (q *memoryQueue) Leave(now int64, p ratelimit.Policy, id string) (turn, moved int64) {
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
func (q *memoryQueue) Served(now int64) bool {
	return len(q.turns) == 0 || q.turns[len(q.turns)-1] <= float64(now)
}
