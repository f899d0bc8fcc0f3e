// Package fallback is the fleet's insurance while Redis cannot decide: a replica decides in its
// own memory, with an exact sliding-window log per key, at its share of each limit, ⌈Limit / N⌉
// for a fleet of N replicas, so the fleet as a whole admits at most about the limit
// (⌈Limit/N⌉ × N). It owns that memory and the heartbeat that counts the fleet.
//
// What it buys: a route whose fail mode is local stays limited through an outage, instead of
// serving everyone (open) or no one (closed). What it costs: a heartbeat per replica each second
// (heartbeat.lua), memory for up to Options.LogSize keys, and a bound only as good as the count:
// N is the number of replicas the heartbeat last counted while Redis answered, and never fewer
// than Options.FleetSize (the floor, all there is before Redis ever answered). Replicas added
// during an outage are not counted: each admits up to ⌈Limit/floor⌉ on top, since a replica that
// never reached Redis counts the floor (set Options.FleetSize to the fleet's real size). The
// memory starts empty and is kept when Redis answers again, swept at each beat once its windows
// pass: what was admitted locally is on top of Redis's own count, and outages one after
// another within a window share one share, never a fresh one each
// (TestOutagesInAWindowShareOneShare).
package fallback

import (
	"context"
	"crypto/rand"
	"embed"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pixlimit/pixlimit/internal/ratelimit"
	"github.com/pixlimit/pixlimit/internal/ratelimit/queue"
)

// Heartbeat timing: every replica beats each second, and one silent for five is no longer
// counted (a new replica is counted within a second, a gone one within five).
const (
	heartbeatEvery = time.Second
	heartbeatTTL   = 5 * time.Second
)

//go:embed heartbeat.lua
var files embed.FS

// heartbeatScript keeps the fleet's roster and counts it.
var heartbeatScript = func() *redis.Script {
	src, err := files.ReadFile("heartbeat.lua")
	if err != nil {
		panic("fallback: no heartbeat.lua")
	}
	return redis.NewScript(string(src))
}()

// Options configure a Fallback. The zero value of each field has a default.
type Options struct {
	// FleetSize is the fewest replicas the Fallback assumes share the limits. Default 1.
	FleetSize int
	// LogSize bounds the keys it remembers. Default 100,000.
	LogSize int
	// Prefix is the Limiter's key prefix ("": its default), which names the fleet's roster.
	Prefix string
	// Timeout is the budget of a beat, and what a queue's wait leaves for a decision's own
	// call (as the Limiter's). Default 100ms.
	Timeout time.Duration
	// Now is the clock it decides by (ratelimit.Options.Now): tests only.
	Now func() time.Time
}

// Fallback decides in memory what Redis cannot.
type Fallback struct {
	keys    *ratelimit.Limiter // names the keys, as Redis has them
	queue   *queue.Queue       // nil: a queue's requests are not held back when the replica is full
	rdb     redis.Scripter
	memory  *memory
	roster  string
	id      string
	timeout time.Duration
	now     func() time.Time
	fleet   atomic.Int64
	floor   int64

	closing   chan struct{}
	closeOnce sync.Once
	beating   sync.WaitGroup
}

// New returns the Fallback of l's replica, whose queue's waiters are q's, and starts its
// heartbeat on rdb; Close stops it.
func New(l *ratelimit.Limiter, rdb redis.Scripter, q *queue.Queue, opts Options) *Fallback {
	f := &Fallback{keys: l, queue: q, rdb: rdb, id: rand.Text(), timeout: opts.Timeout, now: opts.Now,
		floor: int64(max(1, opts.FleetSize)), closing: make(chan struct{})}
	if f.timeout <= 0 {
		f.timeout = 100 * time.Millisecond
	}
	if f.now == nil {
		f.now = time.Now
	}
	if opts.LogSize <= 0 {
		opts.LogSize = 100_000
	}
	if opts.Prefix == "" {
		opts.Prefix = ratelimit.DefaultPrefix
	}
	f.memory, f.roster = newMemory(opts.LogSize), opts.Prefix+":{fleet}"
	f.fleet.Store(f.floor)
	f.beating.Add(1) // Close waits for it
	go f.heartbeat()
	return f
}

// heartbeat beats until Close, keeping the fleet's count current (beaten).
func (f *Fallback) heartbeat() {
	defer f.beating.Done()
	tick := time.NewTicker(heartbeatEvery)
	defer tick.Stop()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), f.timeout)
		n, err := heartbeatScript.Run(ctx, f.rdb, []string{f.roster}, f.id, heartbeatTTL.Milliseconds()).Int64()
		cancel()
		f.beaten(n, err)
		select {
		case <-tick.C:
		case <-f.closing:
			return
		}
	}
}

// beaten takes a beat's answer: the fleet's size n, never below the floor (a fleet starting
// together first sees itself alone), or its failure, which keeps the last count. The memory is
// not forgotten when Redis answers again: a next outage within the window starts from what this
// replica admitted in the last, or a Redis that comes and goes would hand out a fresh share each
// time it goes. What has left its windows is swept (memory.sweep), so an outage's memory is
// freed once its windows have passed.
func (f *Fallback) beaten(n int64, err error) {
	if err == nil {
		f.fleet.Store(max(n, f.floor))
		f.memory.sweep(f.now())
	}
}

// FleetSize is how many replicas share the limits: those the heartbeat last counted while Redis
// answered, and never fewer than Options.FleetSize (replicas starting together first count
// themselves alone; a single replica is then stricter than it need be).
func (f *Fallback) FleetSize() int { return int(f.fleet.Load()) }

// Allow decides a request in this replica's memory, at its share of each check's limit
// (⌈Limit / FleetSize⌉ per Window, every meter counted as an exact sliding log): what a caller
// does instead of failing open or closed while Redis cannot decide. The Decision reports the
// local quota as each Result's Policy.Limit and Capacity, and Fallback is set. The checks are
// decided together: admitted only if every key has room, and recorded in all or none. A queue
// (LeakyBucket) paces here at its share, ⌈Limit / N⌉ per Window with ⌈Queue / N⌉ places, and its
// admission waits its turn as any (queue.Queue.Wait), within ctx's deadline.
func (f *Fallback) Allow(ctx context.Context, checks ...ratelimit.Check) ratelimit.Decision {
	n := max(1, int(f.fleet.Load()))
	now := f.now()
	if len(checks) == 1 && checks[0].Policy.Algorithm == ratelimit.LeakyBucket {
		return f.queued(ctx, checks[0], n, now)
	}
	keys := make([]string, len(checks))
	local := make([]ratelimit.Check, len(checks))
	quotas := make([]ratelimit.Policy, len(checks))
	for i, c := range checks {
		keys[i] = f.keys.Key(c)
		q := c.Policy
		q.Limit = (c.Policy.Limit + n - 1) / n // the sustained rate's share: a bucket's burst (Capacity) would let the fleet pass Limit
		q.Algorithm, q.Burst = ratelimit.SlidingLog, 0
		quotas[i], local[i] = q, ratelimit.Check{Policy: q, Identity: c.Identity}
	}
	allowed, pairs := f.memory.allow(now, keys, quotas)
	d := ratelimit.NewDecision(allowed, pairs, local) // as a script's reply would build it
	d.Fallback = true
	return d
}

// queued is Allow of one queue's request, at now, in a fleet of n.
func (f *Fallback) queued(ctx context.Context, c ratelimit.Check, n int, now time.Time) ratelimit.Decision {
	q := c.Policy
	q.Limit, q.Queue = (q.Limit+n-1)/n, (q.Queue+n-1)/n
	local := ratelimit.Check{Policy: q, Identity: c.Identity}
	if f.queue != nil {
		if d, full := f.queue.Refusal(local, true); full { // no place taken: the replica cannot hold one more
			d.Fallback = true
			return d
		}
	}
	within := int64(-1) // no deadline: as long as the queue
	if dl, ok := ctx.Deadline(); ok {
		within = max(0, (time.Until(dl) - f.timeout).Microseconds())
	}
	key, id := f.keys.Key(c), rand.Text()
	allowed, remaining, reset, wait := f.memory.queue(now, key, q, within, id)
	d := ratelimit.NewDecision(allowed, []int64{remaining, reset}, []ratelimit.Check{local})
	d.Fallback = true
	if allowed {
		d.Wait = time.Duration(wait) * time.Microsecond
		d.Place = &ratelimit.Place{Key: key, Owner: c.Identity, ID: id, Turn: now.UnixMicro() + wait, Decided: now.UnixMicro(), Policy: q,
			Leave: func() (turn, moved, at int64) {
				at = f.now().UnixMicro()
				turn, moved = f.memory.leave(key, id, at, q)
				return turn, moved, at
			}}
	}
	return d
}

// Close stops the heartbeat and waits for it.
func (f *Fallback) Close() error {
	f.closeOnce.Do(func() { close(f.closing) })
	f.beating.Wait()
	return nil
}
