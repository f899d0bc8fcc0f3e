package ratelimit

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// breaker stops asking a Redis that keeps failing. After threshold consecutive failed decisions
// it opens: for cooldown every decision fails at once, as Redis's own failure would, and the
// caller's fail mode answers without waiting the budget out. Then it probes Redis itself, in the
// background, within the budget (half-open), while decisions keep failing at once: no request
// pays for the probe. Success closes the breaker; failure opens it for another cooldown. A hung
// Redis otherwise costs every request the whole budget.
type breaker struct {
	threshold int
	cooldown  time.Duration
	timeout   time.Duration                   // of a probe
	probe     func(ctx context.Context) error // one cheap command
	clock     func() time.Time
	logger    *slog.Logger

	closed   atomic.Bool  // the common case, read without the lock
	failures atomic.Int64 // consecutive, while closed

	mu      sync.Mutex
	until   time.Time // end of the cool-down, while open
	probing bool      // a probe is in flight
	opened  time.Time // when it last opened
	probes  sync.WaitGroup
}

func newBreaker(threshold int, cooldown, timeout time.Duration, probe func(context.Context) error, clock func() time.Time, logger *slog.Logger) *breaker {
	b := &breaker{threshold: threshold, cooldown: cooldown, timeout: timeout, probe: probe, clock: clock, logger: logger}
	b.closed.Store(true)
	return b
}

// allow reports whether a decision may ask Redis now: only while the breaker is closed. Once an
// open breaker's cool-down is over, the first call starts the probe.
func (b *breaker) allow() bool {
	if b.closed.Load() {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed.Load() {
		return true
	}
	if !b.probing && !b.clock().Before(b.until) {
		b.probing = true
		b.probes.Add(1)
		go b.runProbe()
	}
	return false
}

func (b *breaker) runProbe() {
	defer b.probes.Done()
	ctx, cancel := context.WithTimeout(context.Background(), b.timeout)
	defer cancel()
	if err := b.probe(ctx); err != nil {
		b.failure()
		return
	}
	b.success()
}

// success records a decision (or a probe) Redis answered: the breaker closes.
func (b *breaker) success() {
	if b.closed.Load() && b.failures.Load() == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.closed.Load() {
		b.logger.Info("rate limiter circuit closed: Redis answers again",
			"open_for", b.clock().Sub(b.opened).Round(time.Millisecond).String())
	}
	b.failures.Store(0)
	b.probing = false
	b.closed.Store(true)
}

// failure records a decision (or a probe) Redis could not answer; the threshold-th in a row, or
// a failed probe, opens the breaker for a cool-down.
func (b *breaker) failure() {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.clock()
	if b.closed.Load() {
		n := b.failures.Add(1)
		if n < int64(b.threshold) {
			return
		}
		b.opened = now
		b.logger.Warn("rate limiter circuit open: decisions fail at once, by their fail mode",
			"consecutive_failures", n, "cooldown", b.cooldown.String())
	}
	b.closed.Store(false)
	b.probing = false
	b.until = now.Add(b.cooldown)
}
