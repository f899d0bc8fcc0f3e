package fallback

import (
	"slices"
	"sync"
	"time"

	"github.com/pixlimit/pixlimit/internal/ratelimit"
)

// memory is an exact sliding-window log in memory, for Fallback.Allow: per key, the times
// of its admissions in the last window, at most its limit of them. Memory is bounded: at most
// max keys (and a decision's, makeRoom), and when full, keys whose entries have all expired go
// first, then the key touched longest ago. It is kept when Redis answers again, and what has left
// its windows is swept then (Fallback.beaten).
type memory struct {
	max int

	mu     sync.Mutex
	keys   map[string]*fallbackKey
	queues map[string]*memoryQueue // a queue's places (LeakyBucket), as its script keeps them
}

type fallbackKey struct {
	times   []time.Time // admissions, oldest first, at most the key's limit
	window  time.Duration
	touched time.Time
}

func newMemory(max int) *memory {
	return &memory{max: max, keys: map[string]*fallbackKey{}, queues: map[string]*memoryQueue{}}
}

// allow admits a request at now if every key holds fewer than its policy's Limit admissions in
// the window before now, recording it in all; else it records nothing. It returns, per key, as
// a script's reply does, how many more it admits now and the microseconds until it admits one
// more than that (newDecision reads them).
func (l *memory) allow(now time.Time, keys []string, ps []ratelimit.Policy) (bool, []int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ks := make([]*fallbackKey, len(keys))
	allowed := true
	for i, key := range keys {
		k := l.keys[key]
		if k == nil {
			l.makeRoom(now, keys[:i]) // never one this decision holds already
			k = &fallbackKey{}
			l.keys[key] = k
		}
		k.touched, k.window = now, ps[i].Window
		cut := 0
		for cut < len(k.times) && !k.times[cut].After(now.Add(-ps[i].Window)) {
			cut++
		}
		k.times = k.times[cut:]
		if len(k.times) >= ps[i].Limit {
			allowed = false
		}
		ks[i] = k
	}
	pairs := make([]int64, 2*len(keys))
	for i, k := range ks {
		if allowed {
			k.times = append(k.times, now)
		}
		pairs[2*i] = int64(max(0, ps[i].Limit-len(k.times)))
		if len(k.times) > 0 {
			// One more fits when the entry of rank len-limit leaves the window: the oldest, when full.
			at := k.times[max(0, len(k.times)-ps[i].Limit)]
			pairs[2*i+1] = at.Add(ps[i].Window).Sub(now).Microseconds()
		}
	}
	return allowed, pairs
}

// makeRoom drops a key when the log is full, looking at a few keys only (Go's map order is
// random), so a flood of new identities costs each request the same: an expired one among them
// if there is one, else the one of them touched longest ago; never one of held (the decision's
// keys fetched before: dropped, its admission would be recorded in a key no longer there). When
// every key it looks at is held, it drops none: the log then exceeds max by at most a
// decision's keys. l.mu is held.
func (l *memory) makeRoom(now time.Time, held []string) {
	if len(l.keys) < l.max {
		return
	}
	var victim string
	seen := 0
	for key, k := range l.keys {
		if slices.Contains(held, key) {
			continue
		}
		if len(k.times) == 0 || !k.times[len(k.times)-1].After(now.Add(-k.window)) {
			victim = key
			break
		}
		if victim == "" || k.touched.Before(l.keys[victim].touched) {
			victim = key
		}
		if seen++; seen == 8 {
			break
		}
	}
	delete(l.keys, victim)
}

// queue decides one request of key's queue under p at now, taking a place named id when
// admitted; within < 0 waits as long as the queue (memoryQueue.Take).
func (l *memory) queue(now time.Time, key string, p ratelimit.Policy, within int64, id string) (bool, int64, int64, int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	q := l.queues[key]
	if q == nil {
		if len(l.queues) >= l.max {
			l.dropServedQueues(now.UnixMicro())
		}
		q = &memoryQueue{}
		l.queues[key] = q
	}
	return q.Take(now.UnixMicro(), p, within, id, true)
}

// sweep drops every key whose admissions have all left their window, and every queue in which
// nobody waits: the memory an outage left, once its windows have passed (Fallback.beaten, each
// beat Redis answers). Nothing to do, it costs a lock.
func (l *memory) sweep(now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for key, k := range l.keys {
		if len(k.times) == 0 || !k.times[len(k.times)-1].After(now.Add(-k.window)) {
			delete(l.keys, key)
		}
	}
	for key, q := range l.queues {
		if q.Served(now.UnixMicro()) {
			delete(l.queues, key)
		}
	}
}

// dropServedQueues drops the queues in which nobody waits, looking at a few only, as makeRoom:
// one whose places all are served is, in a pace, empty. A queue with waiters is never dropped
// (they are bounded by queue.Options.MaxWaiting). l.mu is held.
func (l *memory) dropServedQueues(now int64) {
	seen := 0
	for key, q := range l.queues {
		if q.Served(now) {
			delete(l.queues, key)
		}
		if seen++; seen == 8 {
			return
		}
	}
}

// leave gives id's place in key's queue of p back at now (µs); see memoryQueue.Leave.
func (l *memory) leave(key, id string, now int64, p ratelimit.Policy) (turn, moved int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if q := l.queues[key]; q != nil {
		return q.Leave(now, p, id)
	}
	return 0, 0
}

// size is how many keys the log holds.
func (l *memory) size() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.keys)
}
