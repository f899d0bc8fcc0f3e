package ratelimit

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pixlimit/pixlimit/internal/testing/redistest"
)

// world is a fleet of replicas over clients from newClient, with one injected clock; its keys
// have their own prefix, so two worlds share a server without meeting.
func world(t *testing.T, newClient func() redis.Scripter, prefix string, replicas int, clk *clock) []*Limiter {
	t.Helper()
	ls := make([]*Limiter, replicas)
	for i := range ls {
		l, err := New(newClient(), Options{KeySecret: testSecret, Timeout: generous, Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		l.now = clk.Now
		ls[i] = l
	}
	return ls
}

// sameWait allows the sliding window its one microsecond of integer rounding, which may fall on
// either side once the deadline crosses into the next calendar window.
func sameWait(a, b time.Duration) bool { return (a - b).Abs() <= time.Microsecond }

func sameResult(a, b Result) bool {
	return a.Policy == b.Policy && a.Remaining == b.Remaining && sameWait(a.Reset, b.Reset) && sameWait(a.RetryAfter, b.RetryAfter)
}

// randomStep moves clk on by up to short (most steps), up to 2ms (a few, so requests crowd a
// key), or up to long (now and then, so windows pass), on whole microseconds as Redis counts.
func randomStep(clk *clock, rng *rand.Rand, short, long time.Duration) {
	switch r := rng.IntN(100); {
	case r < 78:
		clk.Add(time.Duration(rng.Int64N(int64(short))))
	case r < 95:
		clk.Add(time.Duration(rng.IntN(2000)) * time.Microsecond)
	default:
		clk.Add(time.Duration(rng.Int64N(int64(long))))
	}
	clk.Set(clk.Now().Truncate(time.Microsecond))
}

// client makes clients of srv with the generous budget.
func client(srv *redistest.Server) func() redis.Scripter {
	return func() redis.Scripter { return srv.Client(func(o *redis.Options) { ClientOptions(o, generous) }) }
}
