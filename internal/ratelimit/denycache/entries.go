package denycache

import (
	"container/heap"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pixlimit/pixlimit/internal/ratelimit"
)

// entries remember, per Redis key, until when this replica knows the key is full. They are found
// by the check that names the key (its policy's name and algorithm, and its identity), so that a
// refusal from memory computes no key (an HMAC: about a tenth of what a refused request costs),
// and by the key itself, which the other replicas announce. Memory is bounded by max entries
// (about 380 bytes each: the key, the identity, the policy, two map slots and a heap slot;
// TestDenyCacheMemory measures it); when full, the entry that expires soonest goes first,
// which is an expired one whenever there is one.
//
// They also number the forgets (a desk's reset, another replica's announcement, a refund: each
// made once its change is made in Redis, a refund's also as it is sent) and remember each key's
// last, so that a refusal Redis decided before a forget, whose answer comes back after it, does
// not block the key again: a decision is learnt only if its key was not forgotten after the
// decision read the count (seen), before it was sent. Numbers, not clock readings: two readings
// can be equal (a test's clock stands still). That memory keeps the forgets of the last
// forgetMemory, at most max of them (about 95 bytes each besides its key, TestDenyCacheMemory);
// a decision that saw fewer forgets than one it has let go is not learnt either (floor), which
// costs a Redis call, never a wrong refusal.
type entries struct {
	max     int
	forgets atomic.Uint64 // how many forgets were made; changed under mu

	mu      sync.Mutex
	entries map[string]*denied
	byCheck map[checkOf]*denied
	byUntil untilHeap

	forgotten map[string]uint64 // each key's last forget still remembered, by its number
	recent    []forgetting      // the forgets remembered, oldest first
	floor     uint64            // the latest forget let go: a decision that saw fewer is not learnt
}

// forgetMemory is how long a key's forget is remembered: longer than any decision is on its way
// (a call's budget, REDIS_TIMEOUT, is a minute at most).
const forgetMemory = 2 * time.Minute

// forgetting is forget number n, of key, at at.
type forgetting struct {
	key string
	n   uint64
	at  time.Time
}

// checkOf names a check's key without hashing its identity: a Limiter's key is
// prefix:policy[:algorithm]:{HMAC(identity)}, one to one with this.
type checkOf struct {
	policy    string
	algorithm ratelimit.Algorithm
	identity  string
}

func checkOfCheck(ch ratelimit.Check) checkOf {
	return checkOf{ch.Policy.Name, ch.Policy.Algorithm, ch.Identity}
}

type denied struct {
	key      string
	check    checkOf
	policy   ratelimit.Policy // the policy that refused: a key checked under another (a new tier) is not known full
	until    time.Time        // when this entry stops answering: the deadline, or sooner (Options.Hold)
	deadline time.Time        // when the key can have room again, as Redis said
	index    int              // in byUntil
}

func newEntries(max int) *entries {
	return &entries{max: max, entries: make(map[string]*denied), byCheck: make(map[checkOf]*denied),
		forgotten: make(map[string]uint64)}
}

// seen is how many forgets were made: a decision reads it before it is sent, for block.
func (c *entries) seen() uint64 { return c.forgets.Load() }

// blockedUntil reports until when ch's key is known to be full under ch's policy, if the entry
// still answers at now. An entry learnt under another policy (a decision made under the account's
// former tier, that came back after the tier changed) answers nothing, and goes.
func (c *entries) blockedUntil(ch ratelimit.Check, now time.Time) (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.byCheck[checkOfCheck(ch)]
	if !ok {
		return time.Time{}, false
	}
	if !now.Before(e.until) || e.policy != ch.Policy {
		c.removeLocked(e)
		return time.Time{}, false
	}
	return e.deadline, true
}

// block records that ch's key, key, is full under ch's policy until deadline, an entry that
// answers until until (≤ deadline), as a decision that had seen seen forgets said; unless the key
// was forgotten since: Redis may have decided before the forget.
func (c *entries) block(key string, ch ratelimit.Check, seen uint64, until, deadline time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.forgotten[key] > seen || c.floor > seen {
		return
	}
	if e, ok := c.entries[key]; ok {
		if check := checkOfCheck(ch); check != e.check { // the same key named another way (its algorithm left to the default)
			delete(c.byCheck, e.check)
			e.check, c.byCheck[check] = check, e
		}
		e.policy, e.until, e.deadline = ch.Policy, until, deadline
		heap.Fix(&c.byUntil, e.index)
		return
	}
	if len(c.entries) >= c.max {
		c.removeLocked(c.byUntil[0])
	}
	e := &denied{key: key, check: checkOfCheck(ch), policy: ch.Policy, until: until, deadline: deadline}
	heap.Push(&c.byUntil, e)
	c.entries[key] = e
	c.byCheck[e.check] = e
}

// forget drops each key's entry, if any: its key may have room before the entry's deadline. It
// counts the forget, made at at, and remembers it for the key, so that no decision sent before is
// learnt (block).
func (c *entries) forget(at time.Time, keys ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, key := range keys {
		c.forgetLocked(key, at)
	}
}

// forgetLocked is forget of one key; c.mu is held.
func (c *entries) forgetLocked(key string, at time.Time) {
	if e, ok := c.entries[key]; ok {
		c.removeLocked(e)
	}
	n := c.forgets.Add(1)
	c.forgotten[key] = n
	c.recent = append(c.recent, forgetting{key, n, at})
	for len(c.recent) > 0 && (len(c.recent) > c.max || c.recent[0].at.Before(at.Add(-forgetMemory))) {
		old := c.recent[0]
		c.recent[0] = forgetting{}
		c.recent = c.recent[1:]
		if c.forgotten[old.key] == old.n { // not forgotten again since: its memory goes
			delete(c.forgotten, old.key)
			c.floor = max(c.floor, old.n)
		}
	}
}

// removeLocked drops e from the maps and the heap; c.mu is held.
func (c *entries) removeLocked(e *denied) {
	heap.Remove(&c.byUntil, e.index)
	delete(c.entries, e.key)
	delete(c.byCheck, e.check)
}

// len is the number of entries, expired ones included until they are found or pushed out.
func (c *entries) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}

// untilHeap orders entries by deadline, soonest first (container/heap).
type untilHeap []*denied

func (h untilHeap) Len() int           { return len(h) }
func (h untilHeap) Less(i, j int) bool { return h[i].until.Before(h[j].until) }
func (h untilHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *untilHeap) Push(x any) {
	e := x.(*denied)
	e.index = len(*h)
	*h = append(*h, e)
}
func (h *untilHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return e
}
