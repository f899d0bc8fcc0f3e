package ratelimit

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Policy is one limit: Limit requests per identity per Window, counted by Algorithm. With the
// default, SlidingLog, that is at most Limit requests in any interval of length Window.
//
// A Policy is plain data, checked once by Validate where it is built (the configuration, a
// server's constructor); a Limiter trusts the policies it is given. It says what a decision
// needs and nothing else: what a caller does with a decision, or without one (fail open or
// closed, enforce or only watch), is the caller's.
type Policy struct {
	// Name identifies the policy in Redis keys and to the caller; it must be
	// 1–32 of [a-z0-9_-].
	Name string
	// Limit is the number of requests admitted per Window (for TokenBucket and GCRA, the
	// sustained rate: Limit per Window), at least 1.
	Limit int
	// Window is the window's length: a whole number of milliseconds, at least 1ms.
	Window time.Duration
	// Algorithm counts; the zero value is SlidingLog.
	Algorithm Algorithm
	// Burst is, for TokenBucket and GCRA only, how many requests may come at once: the bucket's
	// capacity. Zero means Limit. Other algorithms take no Burst.
	Burst int
	// Queue is, for LeakyBucket only, how many requests may wait for their turns: at least 1.
	// Other algorithms take no Queue.
	Queue int
}

// Capacity is the most requests p admits at once: Burst (default Limit) for a bucket, the places
// of a queue (Queue), else Limit.
func (p Policy) Capacity() int {
	switch {
	case p.algorithm() == LeakyBucket:
		return p.Queue
	case p.algorithm().Bursty() && p.Burst > 0:
		return p.Burst
	}
	return p.Limit
}

// Pace is the time between two turns of a queue (LeakyBucket): Window / Limit.
func (p Policy) Pace() time.Duration { return p.Window / time.Duration(max(1, p.Limit)) }

// algorithm is p.Algorithm with its default.
func (p Policy) algorithm() Algorithm {
	if p.Algorithm == "" {
		return SlidingLog
	}
	return p.Algorithm
}

// PolicyError says which field of a policy is unusable and why.
type PolicyError struct {
	Policy string // the policy's name
	Field  string // "Name", "Limit", "Window", "Algorithm", "Burst" or "Queue"
	Reason string
}

func (e *PolicyError) Error() string {
	return fmt.Sprintf("policy %q: %s: %s", e.Policy, e.Field, e.Reason)
}

// Validate reports what makes p unusable, if anything: one *PolicyError per unusable field,
// joined (errors.Join).
func (p Policy) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, &PolicyError{Policy: p.Name, Field: field, Reason: fmt.Sprintf(format, args...)})
	}
	if len(p.Name) == 0 || len(p.Name) > 32 || strings.Trim(p.Name, "abcdefghijklmnopqrstuvwxyz0123456789_-") != "" {
		bad("Name", "want 1-32 of [a-z0-9_-]")
	}
	if p.Limit < 1 {
		bad("Limit", "%d: want at least 1", p.Limit)
	}
	if p.Window < time.Millisecond || p.Window%time.Millisecond != 0 {
		bad("Window", "%v: want a whole number of milliseconds, at least 1ms", p.Window)
	}
	if _, ok := scripts[p.algorithm()]; !ok {
		bad("Algorithm", "%q: want one of %v", p.Algorithm, Algorithms())
	}
	// The packed log keeps times modulo 2^32 µs: a key's newest is at most a window and a
	// quarter old (sliding_log_packed.lua), which must stay under 2^31 µs (35.8 minutes).
	if p.algorithm() == SlidingLogPacked && p.Window > 28*time.Minute {
		bad("Window", "%v: sliding_log_packed takes windows up to 28 minutes (sliding_log takes any)", p.Window)
	}
	if p.Burst < 0 || p.Burst > 0 && !p.algorithm().Bursty() {
		bad("Burst", "%d: only token_bucket and gcra take a burst (at least 1)", p.Burst)
	}
	if a := p.algorithm(); a == LeakyBucket && p.Queue < 1 || a != LeakyBucket && p.Queue != 0 {
		bad("Queue", "%d: only leaky_bucket takes a queue, of at least 1", p.Queue)
	}
	// A waiter's timer and a turn's score are kept in whole microseconds and judged in
	// milliseconds: a pace shorter than that would not be kept.
	if p.algorithm() == LeakyBucket && p.Limit > 0 && p.Window/time.Duration(p.Limit) < time.Millisecond {
		bad("Limit", "%d per %v: a leaky_bucket's pace (window / limit) must be at least 1ms", p.Limit, p.Window)
	}
	// The sliding window, the token bucket and GCRA multiply counts by the window in
	// microseconds; Lua numbers are exact integers only below 2^53.
	if a := p.algorithm(); (a == SlidingWindow || a == TokenBucket || a == GCRA) &&
		float64(max(p.Limit, p.Capacity()))*float64(p.Window.Microseconds()) >= 1<<53 {
		bad("Limit", "limit × window too large for exact arithmetic (%d × %v)", max(p.Limit, p.Capacity()), p.Window)
	}
	return errors.Join(errs...)
}

// ValidateTogether validates policies that are decided together, in one AllowAll: each must be
// valid, and all must share an algorithm, since one script decides them all.
func ValidateTogether(ps ...Policy) error {
	for _, p := range ps {
		if err := p.Validate(); err != nil {
			return err
		}
		if p.algorithm() != ps[0].algorithm() {
			return &PolicyError{Policy: p.Name, Field: "Algorithm",
				Reason: fmt.Sprintf("%s, decided together with %s's %s: policies decided together share an algorithm",
					p.algorithm(), ps[0].Name, ps[0].algorithm())}
		}
	}
	return nil
}
