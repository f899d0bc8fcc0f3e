package ratelimit

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// outageLog reports decisions Redis could not make, per policy, at most once per interval with a
// count of those it held back, so a long outage says so every few seconds instead of once per
// request. When a policy decides again after an outage it says that once too, with the outage as
// it was seen: from the policy's first failed decision to its last. The time from the last failure
// to the recovery is logged apart (last_failure_ago): a policy that no request used after Redis
// came back would otherwise report its idle time as outage.
type outageLog struct {
	logger   *slog.Logger
	every    time.Duration
	now      func() time.Time
	degraded atomic.Bool // any policy in outage; keeps the healthy path lock-free

	mu       sync.Mutex
	policies map[string]*outage
}

type outage struct {
	since, last, logged time.Time // first failure, last failure, last report
	held                int       // failures since the last report
}

func newOutageLog(logger *slog.Logger, every time.Duration, now func() time.Time) *outageLog {
	return &outageLog{logger: logger, every: every, now: now, policies: map[string]*outage{}}
}

func (o *outageLog) failed(p Policy, cause error) {
	now := o.now()
	o.mu.Lock()
	defer o.mu.Unlock()
	o.degraded.Store(true)
	st, ok := o.policies[p.Name]
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

func (o *outageLog) decided(p Policy) {
	if !o.degraded.Load() {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	st, ok := o.policies[p.Name]
	if !ok {
		return
	}
	delete(o.policies, p.Name)
	o.degraded.Store(len(o.policies) > 0)
	o.logger.Info("rate limiter recovered", "policy", p.Name,
		"outage", st.last.Sub(st.since).Round(time.Millisecond).String(),
		"last_failure_ago", o.now().Sub(st.last).Round(time.Millisecond).String(), "held_back", st.held)
}
