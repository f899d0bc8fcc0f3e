package ratelimit

import (
	"context"
	"time"
)

// The fleet's insurance while Redis cannot decide: a replica may decide in its own memory, with
// an exact sliding-window log per key, at its share of each limit, ⌈Limit / N⌉ for a fleet of N
// replicas, so the fleet as a whole admits at most about the limit (⌈Limit/N⌉ × N). N is the
// number of replicas the heartbeat last counted while Redis answered, and never fewer than
// Options.FleetSize (the floor, all there is before Redis ever answered). Replicas added during
// an outage are not counted, and each admits its share on top: with M more, the fleet admits up
// to ⌈Limit/N⌉ × (N + M). The fallback log starts empty and is forgotten when Redis answers
// again (Redis kept its own state; what was admitted locally meanwhile is on top of it).

// Heartbeat timing: every replica beats each second, and one silent for five is no longer
// counted (a new replica is counted within a second, a gone one within five).
const (
	heartbeatEvery = time.Second
	heartbeatTTL   = 5 * time.Second
)

// heartbeat beats until Close, keeping l.fleet current.
func (l *Limiter) heartbeat() {
	defer l.background.Done()
	tick := time.NewTicker(heartbeatEvery)
	defer tick.Stop()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), l.timeout)
		n, err := heartbeatScript.Run(ctx, l.rdb, []string{l.keys.prefix + ":{fleet}"}, l.id, heartbeatTTL.Milliseconds()).Int64()
		cancel()
		if err == nil {
			l.fleet.Store(max(n, l.fleetFloor)) // never below the floor: a fleet starting together first sees itself alone
		}
		select {
		case <-tick.C:
		case <-l.closing:
			return
		}
	}
}

// AllowFallback decides a request in this replica's memory, at its share of each check's limit
// (⌈Limit / Stats.FleetSize⌉ per Window, every meter counted as an exact sliding log): what a
// caller does instead of failing open or closed while Redis cannot decide. The Decision reports
// the local quota as each Result's Policy.Limit and Capacity, and Fallback is set. The checks
// are decided together: admitted only if every key has room, and recorded in all or none.
// A queue (LeakyBucket) paces here at its share, ⌈Limit / N⌉ per Window with ⌈Queue / N⌉
// places, and its admission waits its turn as any (Wait), within ctx's deadline.
func (l *Limiter) AllowFallback(ctx context.Context, checks ...Check) Decision {
	n := max(1, int(l.fleet.Load()))
	now := l.clock()
	if len(checks) == 1 && queued(checks) {
		return l.queueFallback(ctx, checks[0], n, now)
	}
	keys := make([]string, len(checks))
	quotas := make([]Policy, len(checks))
	for i, c := range checks {
		keys[i] = l.keys.key(c.Policy, c.Identity)
		q := c.Policy
		q.Limit = (c.Policy.Capacity() + n - 1) / n
		q.Algorithm, q.Burst = SlidingLog, 0
		quotas[i] = q
	}
	allowed, pairs := l.fallback.allow(now, keys, quotas)
	local := make([]Check, len(checks))
	for i, c := range checks {
		local[i] = Check{Policy: quotas[i], Identity: c.Identity}
	}
	d := newDecision(allowed, pairs, local) // as a script's reply would build it
	d.Fallback = true
	return d
}

// queueFallback is AllowFallback of one queue's request, at now, in a fleet of n.
func (l *Limiter) queueFallback(ctx context.Context, c Check, n int, now time.Time) Decision {
	q := c.Policy
	q.Limit, q.Queue = (q.Limit+n-1)/n, (q.Queue+n-1)/n
	key, id := l.keys.key(c.Policy, c.Identity), requestID()
	if l.waiters.full(c.Identity) {
		d := l.tooManyWaiting([]Check{{Policy: q, Identity: c.Identity}})
		d.Fallback = true
		return d
	}
	o := l.queueOp(ctx, Op{kind: opDecide})
	allowed, remaining, reset, wait := l.fallback.queue(now, key, q, o.within, id)
	d := newDecision(allowed, []int64{remaining, reset}, []Check{{Policy: q, Identity: c.Identity}})
	d.Fallback = true
	if allowed && wait > 0 {
		d.Wait = time.Duration(wait) * time.Microsecond
		d.place = &place{key: key, owner: c.Identity, id: id, turn: now.UnixMicro() + wait, decided: now.UnixMicro(), policy: q, local: true}
	}
	return d
}
