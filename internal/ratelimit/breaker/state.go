package breaker

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// breaker stops asking a Redis that keeps failing. After threshold consecutive failed decisions
// it opens: for cooldown every decision fails at once, as Redis's own failure would, and the
// caller's fail mode answers without waiting the budget out. When the cool-down ends it probes
// Redis itself, on a timer, in the background, within the budget (half-open), while decisions
// keep failing at once: no request pays for the probe, and none waits for one to be started.
// Success closes the breaker, so the first request after a good probe is decided by Redis however
// quiet the route; failure opens it for another cooldown, and another probe at its end. A hung
// Redis otherwise costs every request the whole budget.
type breaker struct {
	threshold int
	cooldown  time.Duration
	timeout   time.Duration                   // of a probe
	probe     func(ctx context.Context) error // one cheap command
	clock     func() time.Time
	logger    *slog.Logger
	// after runs f once d has passed (time.AfterFunc; tests replace it), and returns what stops it.
	after func(d time.Duration, f func()) (stop func() bool)

	closed   atomic.Bool  // the common case, read without the lock
	failures atomic.Int64 // consecutive, while closed

	mu      sync.Mutex
	until   time.Time   // end of the cool-down, while open
	probing bool        // a probe is in flight
	opened  time.Time   // when it last opened
	timer   func() bool // stops the pending probe's timer, while open
	stopped bool        // by stop: no more probes
	probes  sync.WaitGroup
}

func newBreaker(threshold int, cooldown, timeout time.Duration, probe func(context.Context) error, clock func() time.Time, logger *slog.Logger) *breaker {
	b := &breaker{threshold: threshold, cooldown: cooldown, timeout: timeout, probe: probe, clock: clock, logger: logger,
		after: func(d time.Duration, f func()) func() bool { return time.AfterFunc(d, f).Stop }}
	b.closed.Store(true)
	return b
}

// allow reports whether a decision may ask Redis now: only while the breaker is closed. The probe
// starts on its timer; should that be late, a call after the cool-down starts it.
func (b *breaker) allow() bool {
	if b.closed.Load() {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed.Load() {
		return true
	}
	if !b.clock().Before(b.until) {
		b.startProbeLocked()
	}
	return false
}

// startProbe is the cool-down timer's: it starts the probe unless one runs or the breaker closed.
func (b *breaker) startProbe() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.startProbeLocked()
}

func (b *breaker) startProbeLocked() {
	if b.closed.Load() || b.probing || b.stopped {
		return
	}
	b.probing = true
	b.probes.Add(1)
	go b.runProbe()
}

// stop ends the probes for good (Breaker.Close) and waits for one in flight.
func (b *breaker) stop() {
	b.mu.Lock()
	b.stopped = true
	if b.timer != nil {
		b.timer()
	}
	b.mu.Unlock()
	b.probes.Wait()
}

func (b *breaker) runProbe() {
	defer b.probes.Done()
	ctx, cancel := context.WithTimeout(context.Background(), b.timeout)
	defer cancel()
	err := b.probe(ctx)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.probing = false // only the probe says it has ended: one may outlast a close and a reopen
	switch {
	case err == nil:
		b.closeLocked()
	case !b.closed.Load(): // else closed meanwhile (Ready, or a decision Redis answered): it stays so
		b.openLocked(b.clock())
	}
}

// success records a decision Redis answered: the breaker closes.
func (b *breaker) success() {
	if b.closed.Load() && b.failures.Load() == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closeLocked()
}

// closeLocked closes the breaker; b.mu is held.
func (b *breaker) closeLocked() {
	if !b.closed.Load() {
		b.logger.Info("rate limiter circuit closed: Redis answers again",
			"open_for", b.clock().Sub(b.opened).Round(time.Millisecond).String())
	}
	b.failures.Store(0)
	b.closed.Store(true)
	if b.timer != nil {
		b.timer()
		b.timer = nil
	}
}

// failure records a decision Redis could not answer; the threshold-th in a row opens the breaker
// for a cool-down (a failed probe reopens it: runProbe). One that fails while it is open already
// was sent before it opened: it says nothing new, and neither restarts the cool-down nor lets a
// second probe start beside the one in flight.
func (b *breaker) failure() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.closed.Load() {
		return
	}
	n := b.failures.Add(1)
	if n < int64(b.threshold) {
		return
	}
	now := b.clock()
	b.opened = now
	b.logger.Warn("rate limiter circuit open: decisions fail at once, by their fail mode",
		"consecutive_failures", n, "cooldown", b.cooldown.String())
	b.openLocked(now)
}

// openLocked opens the breaker, or keeps it open, for a cool-down from now, after which a probe
// starts; b.mu is held.
func (b *breaker) openLocked(now time.Time) {
	b.closed.Store(false)
	b.until = now.Add(b.cooldown)
	if b.timer != nil {
		b.timer()
	}
	if !b.stopped {
		b.timer = b.after(b.cooldown, b.startProbe)
	}
}
