// Package outages reports a Decider's outages: the decisions Redis could not make are logged per
// policy, at most once per interval with how many were held back, and the policy's recovery is
// logged once, with the outage as it was seen.
//
// What it buys: an outage of a minute at thousands of requests a second is a few lines per
// policy, not a line per request, and it says how long each policy could not decide. What it
// costs: an atomic load per decision while nothing fails, and a lock per failed one. It stands in
// front of the deny cache (package denycache), whose refusals from memory it skips: they say
// nothing of Redis, and one during an outage is no recovery. The routes decide through it, the
// PIX's slot and key mark included; the support desk's ask, made on the Limiter itself, is not
// reported.
package outages

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pixlimit/pixlimit/internal/ratelimit"
)

// Options configure a Log. The zero value of each field has a default.
type Options struct {
	// Logger receives the reports. Default slog.Default().
	Logger *slog.Logger
	// Every is the least time between two reports of one policy's outage. Default (and at or
	// below zero) 10s.
	Every time.Duration
	// Now is the clock the outages are measured by. Default time.Now.
	Now func() time.Time
}

// Log is a ratelimit.Decider that decides through next and reports its outages. When a policy
// decides again after an outage it says so once, with the outage from the policy's first failed
// decision to its last; the time from the last failure to the recovery is logged apart
// (last_failure_ago): a policy that no request used after Redis came back would otherwise report
// its idle time as outage. A policy that fails again, a while after its last failure, Redis
// having answered another policy's decision since, had its outage end unseen: that one is
// reported over, when Redis answered, and a new one begins.
type Log struct {
	next     ratelimit.Decider
	logger   *slog.Logger
	every    time.Duration
	now      func() time.Time
	degraded atomic.Bool // any policy in outage; keeps the healthy path lock-free

	mu       sync.Mutex
	policies map[string]*outage
	lastOK   time.Time // the last decision Redis answered while any policy was in outage
}

type outage struct {
	since, last, logged time.Time // first failure, last failure, last report
	held                int       // failures since the last report
}

// New returns a Log in front of next.
func New(next ratelimit.Decider, opts Options) *Log {
	o := &Log{next: next, logger: cmp.Or(opts.Logger, slog.Default()), every: opts.Every, now: opts.Now, policies: map[string]*outage{}}
	if o.every <= 0 {
		o.every = 10 * time.Second
	}
	if o.now == nil {
		o.now = time.Now
	}
	return o
}

// AllowAll is next's AllowAll, reported.
func (o *Log) AllowAll(ctx context.Context, checks ...ratelimit.Check) (ratelimit.Decision, error) {
	d, err := o.next.AllowAll(ctx, checks...)
	o.report(ctx, d, err, checks)
	return d, err
}

// Decide is next's Decide, reported: the steps that ran decided, and when it failed, the steps
// from the one that failed on could not be decided.
func (o *Log) Decide(ctx context.Context, steps ...ratelimit.Step) (ratelimit.Decisions, error) {
	ds, err := o.next.Decide(ctx, steps...)
	for i, s := range steps {
		switch d, ran := ds.Of(s); {
		case ran:
			o.report(ctx, d, nil, s.Checks())
		case err != nil && i == ds.Ran():
			for _, s := range steps[i:] {
				o.report(ctx, ratelimit.Decision{}, err, s.Checks())
			}
		}
	}
	return ds, err
}

// report notes how a decision over checks went: decided (a refusal from memory, DenyCached, says
// nothing of Redis), unavailable (a client that left is no outage), or neither.
func (o *Log) report(ctx context.Context, d ratelimit.Decision, err error, checks []ratelimit.Check) {
	switch {
	case err == nil && !d.DenyCached:
		for _, c := range checks {
			o.decided(c.Policy)
		}
	case errors.Is(err, ratelimit.ErrUnavailable) && ctx.Err() == nil:
		for _, c := range checks {
			o.failed(c.Policy, err)
		}
	}
}

func (o *Log) failed(p ratelimit.Policy, cause error) {
	now := o.now()
	o.mu.Lock()
	defer o.mu.Unlock()
	o.degraded.Store(true)
	st, ok := o.policies[p.Name]
	// Redis answered another decision since this policy last failed, which was a while ago (a
	// policy failing among others that pass is still in its outage): that outage ended then.
	if ok && o.lastOK.After(st.last) && now.Sub(st.last) >= o.every {
		o.recovered(p.Name, st, o.lastOK)
		ok = false
	}
	if !ok {
		st = &outage{since: now}
		o.policies[p.Name] = st
	}
	st.last = now
	if ok && now.Sub(st.logged) < o.every {
		st.held++
		return
	}
	o.logger.Error("rate limiter unavailable",
		"policy", p.Name, "cause", cause.Error(),
		"outage", now.Sub(st.since).Round(time.Millisecond).String(), "held_back", st.held)
	st.logged, st.held = now, 0
}

func (o *Log) decided(p ratelimit.Policy) {
	if !o.degraded.Load() {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.lastOK = o.now()
	st, ok := o.policies[p.Name]
	if !ok {
		return
	}
	delete(o.policies, p.Name)
	o.degraded.Store(len(o.policies) > 0)
	o.recovered(p.Name, st, o.lastOK)
}

// recovered logs the end of policy's outage st, seen at `at`. o.mu is held.
func (o *Log) recovered(policy string, st *outage, at time.Time) {
	o.logger.Info("rate limiter recovered", "policy", policy,
		"outage", st.last.Sub(st.since).Round(time.Millisecond).String(),
		"last_failure_ago", at.Sub(st.last).Round(time.Millisecond).String(), "held_back", st.held)
}
