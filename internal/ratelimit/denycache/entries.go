package denycache

import (
	"container/heap"
	"sync"
	"time"

	"github.com/pixlimit/pixlimit/internal/ratelimit"
)

// entries remember, per Redis key, until when this replica knows the key is full. Memory is
// bounded by max entries (about 190 bytes each: the key, its policy, its map slot and its heap
// slot; TestDenyCacheMemory measures it); when full, the entry that expires soonest goes first,
// which is an expired one whenever there is one.
type entries struct {
	max int

	mu      sync.Mutex
	entries map[string]*denied
	byUntil untilHeap
}

type denied struct {
	key      string
	policy   ratelimit.Policy // the policy that refused: a key checked under another (a new tier) is not known full
	until    time.Time        // when this entry stops answering: the deadline, or sooner (Options.Hold)
	deadline time.Time        // when the key can have room again, as Redis said
	index    int              // in byUntil
}

func newEntries(max int) *entries {
	return &entries{max: max, entries: make(map[string]*denied)}
}

// blockedUntil reports until when key is known to be full under p, if the entry still answers at
// now. An entry learnt under another policy (a decision made under the account's former tier,
// that came back after the tier changed) answers nothing, and goes.
func (c *entries) blockedUntil(key string, p ratelimit.Policy, now time.Time) (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[key]
	if !ok {
		return time.Time{}, false
	}
	if !now.Before(e.until) || e.policy != p {
		heap.Remove(&c.byUntil, e.index)
		delete(c.entries, key)
		return time.Time{}, false
	}
	return e.deadline, true
}

// block records that key is full under p until deadline, an entry that answers until until
// (≤ deadline).
func (c *entries) block(key string, p ratelimit.Policy, until, deadline time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.entries[key]; ok {
		e.policy, e.until, e.deadline = p, until, deadline
		heap.Fix(&c.byUntil, e.index)
		return
	}
	if len(c.entries) >= c.max {
		oldest := heap.Pop(&c.byUntil).(*denied)
		delete(c.entries, oldest.key)
	}
	e := &denied{key: key, policy: p, until: until, deadline: deadline}
	heap.Push(&c.byUntil, e)
	c.entries[key] = e
}

// forget drops key's entry, if any: its key may have room before the entry's deadline.
func (c *entries) forget(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.entries[key]; ok {
		heap.Remove(&c.byUntil, e.index)
		delete(c.entries, key)
	}
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
