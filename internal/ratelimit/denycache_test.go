package ratelimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pixlimit/pixlimit/internal/testing/redistest"
)

// world is a fleet of replicas over clients from newClient, with one injected clock, and with
// or without the deny cache; its keys have their own prefix, so two worlds share a server
// without meeting.
func world(t *testing.T, newClient func() redis.Scripter, prefix string, replicas, cache int, clk *clock) []*Limiter {
	t.Helper()
	ls := make([]*Limiter, replicas)
	for i := range ls {
		l, err := New(newClient(), Options{KeySecret: testSecret, Timeout: generous, Prefix: prefix, DenyCacheSize: cache})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		l.now = clk.Now
		ls[i] = l
	}
	return ls
}

// TestTheDenyCacheDecidesAsRedisDoes drives the same random trace through two fleets of three
// replicas over one real Redis, one with the deny cache and one without, for every algorithm:
// many identities, one- and two-key decisions, injected time with jumps short and long. Every
// decision must be the same: the verdict always, and the key reported with its Remaining, Reset
// and Retry-After whenever the cached fleet asked Redis; when its deny cache refused, every key it
// reports blocked must be full in the uncached fleet with the same Retry-After. The cache must
// also have answered a good share of the refusals, or the test proves nothing.
func TestTheDenyCacheDecidesAsRedisDoes(t *testing.T) {
	srv := redistest.Start(t)
	for _, a := range meters() {
		t.Run(string(a), func(t *testing.T) {
			t.Parallel()
			clk := &clock{now: time.UnixMicro(1_800_000_000_000_000)}
			plain := world(t, client(srv), "plain-"+string(a), 3, -1, clk)
			cached := world(t, client(srv), "cached-"+string(a), 3, 1000, clk)
			pa := Policy{Name: "a", Limit: 4, Window: 10 * time.Second, Algorithm: a}
			pb := Policy{Name: "b", Limit: 3, Window: 7 * time.Second, Algorithm: a}
			if a.Bursty() {
				pa.Burst = 6
			}
			rng := rand.New(rand.NewPCG(13, uint64(len(a))))
			cachedRefusals, refused := 0, 0
			for step := range 4000 {
				randomStep(clk, rng, 300*time.Millisecond, 12*time.Second)
				x, y := fmt.Sprint(rng.IntN(3)), fmt.Sprint(rng.IntN(3))
				var checks []Check
				switch rng.IntN(3) {
				case 0:
					checks = []Check{{pa, x}}
				case 1:
					checks = []Check{{pb, y}}
				default:
					checks = []Check{{pa, x}, {pb, y}}
				}
				replica := rng.IntN(3)
				want := mustAllow(t, plain[replica], checks...)
				got := mustAllow(t, cached[replica], checks...)
				if got.Allowed != want.Allowed {
					t.Fatalf("step %d %v: cached allowed=%v (deny-cached=%v), Redis alone %v", step, checks, got.Allowed, got.DenyCached, want.Allowed)
				}
				if !want.Allowed {
					refused++
				}
				if !got.DenyCached {
					if !sameResult(got.Worst, want.Worst) {
						t.Fatalf("step %d: cached reports %+v, Redis alone %+v", step, got.Worst, want.Worst)
					}
					continue
				}
				cachedRefusals++
				for i, r := range got.Results {
					if r.RetryAfter == 0 {
						continue // not known to be full: nothing was asked of it
					}
					if w := want.Results[i]; w.Remaining != 0 || !sameWait(r.RetryAfter, w.RetryAfter) {
						t.Fatalf("step %d key %d: refused by the deny cache for %v, Redis alone says remaining %d, retry after %v",
							step, i, r.RetryAfter, w.Remaining, w.RetryAfter)
					}
				}
			}
			t.Logf("%d decisions, %d refused, %d of them by the deny cache", 4000, refused, cachedRefusals)
			if refused < 800 || cachedRefusals < refused/4 {
				t.Errorf("%d refused, %d by the deny cache: the trace did not exercise the cache", refused, cachedRefusals)
			}
		})
	}
}

// sameWait allows the sliding window its one microsecond of integer rounding, which may fall on
// either side once the deadline crosses into the next calendar window.
func sameWait(a, b time.Duration) bool { return (a - b).Abs() <= time.Microsecond }

func sameResult(a, b Result) bool {
	return a.Policy == b.Policy && a.Remaining == b.Remaining && sameWait(a.Reset, b.Reset) && sameWait(a.RetryAfter, b.RetryAfter)
}

// TestADenyCachedKeyIsRefusedWhileRedisIsDown: a key this replica's deny cache knows to be full
// is refused as rate_limit_exceeded, with its wait counting down, with no Redis at all; another
// key gets ErrUnavailable.
func TestADenyCachedKeyIsRefusedWhileRedisIsDown(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	l := replicas(t, srv, 1, generous)[0] // a killed Redis refuses at once: no budget to wait out
	p := policy("pix", 2, time.Minute)
	for range 2 {
		mustAllow(t, l, Check{p, "ana"})
	}
	first := mustAllow(t, l, Check{p, "ana"})
	if first.Allowed || first.DenyCached {
		t.Fatalf("3rd request: allowed=%v deny-cached=%v, want refused by Redis", first.Allowed, first.DenyCached)
	}
	srv.Kill()
	before := l.Stats()
	d, err := l.AllowAll(context.Background(), Check{p, "ana"})
	if err != nil || d.Allowed || !d.DenyCached || d.Worst.RetryAfter <= 0 || d.Worst.RetryAfter > first.Worst.RetryAfter {
		t.Fatalf("with Redis down: %+v, %v; want refused by the deny cache, waiting at most %v", d, err, first.Worst.RetryAfter)
	}
	if after := l.Stats(); after.Redis != before.Redis || after.DenyCached != before.DenyCached+1 {
		t.Errorf("stats %+v after %+v: want one deny-cache refusal and no Redis call", after, before)
	}
	if _, err := l.AllowAll(context.Background(), Check{p, "bruno"}); err == nil {
		t.Error("another key with Redis down: no error, want ErrUnavailable")
	}
}

// TestDenyCacheIsBounded: at its size the cache drops what expires soonest, expired entries
// first, and stays at its size.
func TestDenyCacheIsBounded(t *testing.T) {
	t.Parallel()
	now := time.Now()
	c := newDenyCache(3)
	c.block("expired", now.Add(-time.Second), now.Add(-time.Second))
	c.block("soon", now.Add(time.Second), now.Add(time.Second))
	c.block("late", now.Add(time.Hour), now.Add(time.Hour))
	c.block("new", now.Add(time.Minute), now.Add(time.Minute)) // pushes out "expired"
	c.block("newer", now.Add(time.Minute), now.Add(time.Minute))
	if c.len() != 3 {
		t.Fatalf("%d entries, want 3", c.len())
	}
	for key, want := range map[string]bool{"expired": false, "soon": false, "late": true, "new": true, "newer": true} {
		if _, got := c.blockedUntil(key, now); got != want {
			t.Errorf("%s blocked = %v, want %v", key, got, want)
		}
	}
}

// TestDenyCacheMemory measures the bytes per entry that the package documentation states.
func TestDenyCacheMemory(t *testing.T) {
	const n = 100_000
	keyer := newKeyer("rl", testSecret)
	keys := make([]string, n)
	for i := range keys {
		keys[i] = keyer.key(policy("login-account", 5, time.Minute), fmt.Sprint(i))
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	c := newDenyCache(n)
	until := time.Now().Add(time.Hour)
	for _, k := range keys {
		c.block(k, until, until)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := float64(after.HeapAlloc-before.HeapAlloc) / n
	t.Logf("%.0f bytes per entry (keys of %d bytes, held by the caller too): %.1f MB for %d", per, len(keys[0]), per*n/1e6, n)
	if per > 250 {
		t.Errorf("%.0f bytes per entry, want at most 250 (denyCache's documentation says about 160 with the key)", per)
	}
	runtime.KeepAlive(c)
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

// TestInspectChangesNothingARequestIsAnswered: reading a full key with Inspect reports it full, as
// Redis has it, without teaching the deny cache: the key's next request still asks Redis, which
// (the key cleared behind the Limiter's back, as a restarted Redis would) admits it.
func TestInspectChangesNothingARequestIsAnswered(t *testing.T) {
	t.Parallel()
	l, rdb, _ := newTestLimiter(t)
	c := Check{policy("inspect", 2, time.Minute), "k"}
	mustAllow(t, l, c)
	mustAllow(t, l, c)
	d, err := l.Inspect(context.Background(), c)
	if err != nil || d.Allowed || d.Worst.Remaining != 0 || d.Worst.Capacity != 2 || d.Worst.RetryAfter <= 0 {
		t.Fatalf("Inspect of a full key: %+v, %v; want refused, 0 of 2 left, a RetryAfter", d, err)
	}
	if n := l.Stats().CachedKeys; n != 0 {
		t.Errorf("the deny cache holds %d keys after an Inspect, want 0", n)
	}
	rdb.Del(context.Background(), l.Key(c))
	if d := mustAllow(t, l, c); !d.Allowed || d.DenyCached {
		t.Errorf("the next request after an Inspect: %+v, want Redis to admit it", d)
	}
}
