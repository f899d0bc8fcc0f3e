package memredis

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pixlimit/pixlimit/internal/ratelimit"
	"github.com/redis/go-redis/v9"
)

// start starts a Server and a client of it, both closed when t ends.
func start(t *testing.T) (*Server, *redis.Client) {
	t.Helper()
	mr, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close(); mr.Close() })
	return mr, rdb
}

// TestEmbeddedRedisExpiresKeysOnTime: the embedded default expires a key at its deadline, never
// earlier, whenever within a second it was set (the clock is injected: no sleeping).
func TestEmbeddedRedisExpiresKeysOnTime(t *testing.T) {
	t.Parallel()
	mr, rdb := start(t)
	ctx := context.Background()
	start := time.Date(2026, 11, 30, 12, 0, 0, 900_000_000, time.UTC) // 0.9 s into a second
	mr.SetTime(start)
	if err := rdb.Set(ctx, "k", "v", 1500*time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct {
		after time.Duration
		want  int64
	}{{100 * time.Millisecond, 1}, {1499 * time.Millisecond, 1}, {1500 * time.Millisecond, 0}} {
		mr.SetTime(start.Add(step.after))
		if got := rdb.Exists(ctx, "k").Val(); got != step.want {
			t.Errorf("%v after a 1.5 s TTL: exists = %d, want %d", step.after, got, step.want)
		}
	}
}

// TestEveryAlgorithmRunsOnTheEmbeddedRedis: miniredis runs Lua in Go (gopher-lua), which differs
// from Redis's Lua in corners; every script, deciding and charging, must run on it too.
func TestEveryAlgorithmRunsOnTheEmbeddedRedis(t *testing.T) {
	t.Parallel()
	_, rdb := start(t)
	l, err := ratelimit.New(rdb, ratelimit.Options{KeySecret: []byte("0123456789abcdef"), Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, a := range ratelimit.Algorithms() {
		p := ratelimit.Policy{Name: "embedded", Limit: 2, Window: time.Minute, Algorithm: a}
		q := ratelimit.Policy{Name: "second", Limit: 1, Window: time.Minute, Algorithm: a}
		checks, wants := []ratelimit.Check{{Policy: p, Identity: "x"}, {Policy: q, Identity: "x"}}, []bool{true, false}
		if a == ratelimit.LeakyBucket { // a queue of one key: one served now, one waiting, then full
			p.Queue = 1
			checks, wants = []ratelimit.Check{{Policy: p, Identity: "x"}}, []bool{true, true, false}
		}
		for i, want := range wants {
			d, err := l.AllowAll(ctx, checks...)
			if err != nil || d.Allowed != want {
				t.Errorf("%s, request %d: %+v, %v; want allowed=%v", a, i+1, d, err, want)
			}
		}
	}
	// Concurrent decisions on one key, as a replica under load makes them: they go in batches
	// (batch.lua) whenever calls overlap, and admissions follow one another on a live key (the
	// packed log's SET ... KEEPTTL). Exactly the limit is admitted.
	for _, a := range ratelimit.Algorithms() {
		p := ratelimit.Policy{Name: "concurrent", Limit: 5, Window: time.Hour, Algorithm: a}
		if a == ratelimit.LeakyBucket {
			p.Queue = 4 // one served now, four waiting
		}
		// The fixed and sliding windows count calendar windows, on the embedded Redis's clock: a
		// burst across a boundary is two windows' (the 2× hole, by design). A loaded machine's
		// burst of 24 can take seconds: start it well inside one window.
		if until := time.Until(time.Now().Truncate(p.Window).Add(p.Window)); until < 10*time.Second {
			time.Sleep(until + 100*time.Millisecond)
		}
		var admitted atomic.Int64
		var wg sync.WaitGroup
		for range 24 {
			wg.Go(func() {
				d, err := l.AllowAll(ctx, ratelimit.Check{Policy: p, Identity: "y"})
				if err != nil {
					t.Errorf("%s: %v", a, err)
				}
				if d.Allowed {
					admitted.Add(1)
				}
			})
		}
		wg.Wait()
		if got, want := admitted.Load(), int64(5); got != want {
			t.Errorf("%s: %d of 24 concurrent decisions admitted, want %d", a, got, want)
		}
	}
	bucket := ratelimit.Policy{Name: "lookup", Limit: 2, Window: time.Minute, Algorithm: ratelimit.TokenBucket, Burst: 100}
	if ds, err := l.Decide(ctx, ratelimit.ChargeStep(ratelimit.Check{Policy: bucket, Identity: "x"}, 20)); err != nil || ds.Last().Worst.Remaining != 80 {
		t.Errorf("a cost of 20: %+v, %v; want 80 left", ds.Last().Worst, err)
	}
	if ds, err := l.Decide(ctx, ratelimit.ChargeStep(ratelimit.Check{Policy: bucket, Identity: "x"}, 0)); err != nil || ds.Last().Worst.Remaining != 80 {
		t.Errorf("a cost of 0: %+v, %v; want 80 left", ds.Last().Worst, err)
	}
}
