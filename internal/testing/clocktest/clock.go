// Package clocktest owns the injected clock of the limiter's tests (ratelimit.Options.Now): time
// that moves only when a test moves it, so tests step through windows without sleeping.
package clocktest

import (
	"math/rand/v2"
	"sync"
	"time"
)

// Clock is an injected time, safe for concurrent use.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// New is a Clock at a fixed moment, on a whole microsecond (as Redis counts).
func New() *Clock { return &Clock{now: time.UnixMicro(1_800_000_000_000_000)} }

// Now is the clock's time.
func (c *Clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }

// Set sets the clock's time.
func (c *Clock) Set(t time.Time) { c.mu.Lock(); c.now = t; c.mu.Unlock() }

// Add moves the clock on by d.
func (c *Clock) Add(d time.Duration) { c.mu.Lock(); c.now = c.now.Add(d); c.mu.Unlock() }

// Wander moves the clock on at random, on whole microseconds as Redis counts: by up to short
// (most steps), up to 2ms (a few, so requests crowd a key), or up to long (now and then, so
// windows pass).
func (c *Clock) Wander(rng *rand.Rand, short, long time.Duration) {
	switch r := rng.IntN(100); {
	case r < 78:
		c.Add(time.Duration(rng.Int64N(int64(short))))
	case r < 95:
		c.Add(time.Duration(rng.IntN(2000)) * time.Microsecond)
	default:
		c.Add(time.Duration(rng.Int64N(int64(long))))
	}
	c.Set(c.Now().Truncate(time.Microsecond))
}
