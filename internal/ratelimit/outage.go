package ratelimit

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// outageLog reports decisions Redis could not make, per policy, at most once per interval with a
// count of those it held back, so a long outage says so every few seconds instead of once per
// request. When a policy decides again after an outage it says that once too.
type outageLog struct {
	logger   *slog.Logger
	every    time.Duration
	degraded atomic.Bool // any policy in outage; keeps the healthy path lock-free

	mu       sync.Mutex
	policies map[string]*outage
}

type outage struct {
	since, logged time.Time
	held          int // failures since the last report
}

func newOutageLog(logger *slog.Logger, every time.Duration) *outageLog {
	return &outageLog{logger: logger, every: every, policies: map[string]*outage{}}
}

func (o *outageLog) failed(p Policy, cause error) {
	now := time.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	o.degraded.Store(true)
	st, ok := o.policies[p.Name]
	if !ok {
		st = &outage{since: now}
		o.policies[p.Name] = st
	}
	if ok && now.Sub(st.logged) < o.every {
		st.held++
		return
	}
	o.logger.Error("rate limiter unavailable",
		"policy", p.Name, "fail_mode", p.FailMode.String(), "cause", cause.Error(),
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
		"outage", time.Since(st.since).Round(time.Millisecond).String(), "held_back", st.held)
}
