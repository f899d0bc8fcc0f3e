package fallback

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pixlimit/pixlimit/internal/ratelimit"
	"github.com/pixlimit/pixlimit/internal/testing/clocktest"
	"github.com/pixlimit/pixlimit/internal/testing/redistest"
)

var testSecret = []byte("0123456789abcdef0123456789abcdef")

// generous is a budget no loaded machine outlasts: a timeout is not what these tests test.
const generous = time.Second

// limiter is a Limiter on rdb, on clk when not nil.
func limiter(t *testing.T, rdb redis.Scripter, clk *clocktest.Clock) *ratelimit.Limiter {
	t.Helper()
	o := ratelimit.Options{KeySecret: testSecret, Timeout: generous}
	if clk != nil {
		o.Now = clk.Now
	}
	l, err := ratelimit.New(rdb, o)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// newFallback is a Fallback of l over rdb with opts, closed with the test.
func newFallback(t *testing.T, l *ratelimit.Limiter, rdb redis.Scripter, opts Options) *Fallback {
	t.Helper()
	opts.Timeout = generous
	f := New(l, rdb, nil, opts)
	t.Cleanup(func() { _ = f.Close() })
	return f
}

func policy(name string, limit int, window time.Duration) ratelimit.Policy {
	return ratelimit.Policy{Name: name, Limit: limit, Window: window}
}

type check = ratelimit.Check

// TestAllowDecidesAtItsShare: with a fleet of 3, a limit of 10 is 4 per window in each
// replica's memory, as an exact sliding log (a bucket's too, whatever its burst): 4 admitted, the 5th refused until exactly when the
// oldest leaves the window; two keys are decided together; and the memory is bounded by LogSize.
func TestAllowDecidesAtItsShare(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := srv.Client(nil)
	clk := clocktest.New()
	l := newFallback(t, limiter(t, c, clk), c, Options{LogSize: 100, FleetSize: 3, Now: clk.Now})
	p := policy("statement", 10, time.Minute)
	for i := range 4 {
		if d := l.Allow(context.Background(), check{Policy: p, Identity: "ana"}); !d.Allowed || !d.Fallback || d.Worst.Capacity != 4 || d.Worst.Remaining != 3-i {
			t.Fatalf("local %d: %+v, want admitted, 4 of the share, %d left", i+1, d, 3-i)
		}
		clk.Add(time.Second)
	}
	d := l.Allow(context.Background(), check{Policy: p, Identity: "ana"})
	if d.Allowed || d.Worst.RetryAfter != 56*time.Second || d.Worst.Policy.Limit != 4 {
		t.Fatalf("the 5th: %+v, want refused until the oldest leaves: 56s", d.Worst)
	}
	clk.Add(56*time.Second - time.Microsecond)
	if l.Allow(context.Background(), check{Policy: p, Identity: "ana"}).Allowed {
		t.Fatal("admitted before Retry-After")
	}
	clk.Add(time.Microsecond)
	if !l.Allow(context.Background(), check{Policy: p, Identity: "ana"}).Allowed {
		t.Fatal("refused at Retry-After")
	}
	// A bucket's share is its limit's, not its burst's: 9 at once and 5 per window is 2 per window
	// here (⌈5/3⌉), or the fleet would pass 5 per window.
	bucket := policy("bursty", 5, time.Minute)
	bucket.Algorithm, bucket.Burst = ratelimit.GCRA, 9
	if d := l.Allow(context.Background(), check{Policy: bucket, Identity: "ana"}); d.Worst.Capacity != 2 || d.Worst.Policy.Limit != 2 {
		t.Errorf("a GCRA of 5 per window, burst 9, in a fleet of 3: its local quota %d (%+v), want 2", d.Worst.Capacity, d.Worst.Policy)
	}
	ip, doc := policy("login-ip", 10, time.Minute), policy("login-account", 5, time.Minute) // shares 4 and 2
	for range 2 {
		l.Allow(context.Background(), check{Policy: ip, Identity: "1.2.3.4"}, check{Policy: doc, Identity: "cpf"})
	}
	if d := l.Allow(context.Background(), check{Policy: ip, Identity: "1.2.3.4"}, check{Policy: doc, Identity: "cpf"}); d.Allowed || d.Results[0].Remaining != 2 {
		t.Errorf("two keys, the document's share (2) used: %+v, want refused, the IP key untouched at 2 left", d)
	}
	for i := range 500 {
		l.Allow(context.Background(), check{Policy: p, Identity: fmt.Sprint("flood-", i)})
	}
	if n := l.memory.size(); n > 100 {
		t.Errorf("%d keys in the fallback's memory, want at most LogSize (100)", n)
	}
	l.beaten(1, nil)
	if got := l.FleetSize(); got != 3 {
		t.Errorf("fleet size %d after a beat counted 1, want the floor, 3", got)
	}
}

// TestOutagesInAWindowShareOneShare: a Redis that goes and comes back, three times within a
// window, gives a replica its share once, not once per outage: its memory is kept when Redis
// answers again, so the second and third outages find the share spent; and it is freed once its
// window has passed.
func TestOutagesInAWindowShareOneShare(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := srv.Client(nil)
	clk := clocktest.New()
	l := newFallback(t, limiter(t, c, clk), c, Options{FleetSize: 2, Now: clk.Now})
	ana := check{Policy: policy("statement", 10, time.Minute), Identity: "ana"}
	admitted := 0
	for range 3 {
		l.beaten(0, errors.New("no Redis")) // Redis gone: this replica decides
		for range 10 {
			if l.Allow(context.Background(), ana).Allowed {
				admitted++
			}
		}
		l.beaten(2, nil) // and back
		clk.Add(10 * time.Second)
	}
	if admitted != 5 {
		t.Errorf("%d admitted in three outages within a minute, want 5: the share (⌈10/2⌉) once", admitted)
	}
	// Kept, not leaked: a beat Redis answers once the window has passed frees it.
	l.beaten(2, nil)
	if n := l.memory.size(); n != 1 {
		t.Errorf("%d keys in the memory within the window, want Ana's", n)
	}
	clk.Add(time.Minute)
	l.beaten(2, nil)
	if n := l.memory.size(); n != 0 {
		t.Errorf("%d keys in the memory a window after the outages, want none", n)
	}
}

// TestTheHeartbeatCountsTheFleet: three Fallbacks with a FleetSize floor of 2 beat in one Redis;
// within a few beats each counts 3.
func TestTheHeartbeatCountsTheFleet(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	var ls []*Fallback
	for range 3 {
		c := srv.Client(nil)
		ls = append(ls, newFallback(t, limiter(t, c, nil), c, Options{FleetSize: 2}))
	}
	deadline := time.Now().Add(5 * heartbeatEvery)
	for _, l := range ls {
		for l.FleetSize() != 3 && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if got := l.FleetSize(); got != 3 {
			t.Errorf("fleet size %d after %v, want 3", got, 5*heartbeatEvery)
		}
	}
}

// TestFallbackMemory measures what the fallback's memory costs per identity: 10,000 keys with a share of
// 4 admissions each (statement 30 a minute over 8 replicas), as a flood during an outage fills it.
//
//	go test -run TestFallbackMemory -v ./internal/ratelimit/fallback
func TestFallbackMemory(t *testing.T) {
	log := newMemory(10_000)
	p := policy("statement", 4, time.Minute)
	keys := make([]string, 10_000)
	for i := range keys {
		keys[i] = fmt.Sprintf("rl:statement:{%022d}", i) // a real key's length
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	now := time.Unix(1_800_000_000, 0)
	for i, k := range keys {
		for j := range 4 {
			log.allow(now.Add(time.Duration(i*4+j)*time.Microsecond), []string{k}, []ratelimit.Policy{p})
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := float64(after.HeapAlloc-before.HeapAlloc) / float64(len(keys))
	t.Logf("fallback log: %.0f bytes per identity holding 4 admissions (10,000 identities)", per)
	if per > 1024 {
		t.Errorf("%.0f bytes per identity, want under 1 KiB", per)
	}
	runtime.KeepAlive(log)
}

// TestTheFallbackQueuesAtItsShare: with Redis unable to decide, a replica of a fleet of 2 paces a
// queue of L per window and Q places at ⌈L/2⌉ and ⌈Q/2⌉.
func TestTheFallbackQueuesAtItsShare(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	clk := clocktest.New()
	l := newFallback(t, limiter(t, c, clk), c, Options{FleetSize: 2, Now: clk.Now})
	p := ratelimit.Policy{Name: "local", Limit: 10, Window: time.Second, Algorithm: ratelimit.LeakyBucket, Queue: 5}
	var waits []time.Duration
	for range 5 {
		d := l.Allow(context.Background(), check{Policy: p, Identity: "co"})
		if !d.Allowed {
			break
		}
		waits = append(waits, d.Wait)
	}
	// ⌈10/2⌉ = 5 per second: a pace of 200 ms; ⌈5/2⌉ = 3 places.
	if want := []time.Duration{0, 200 * time.Millisecond, 400 * time.Millisecond, 600 * time.Millisecond}; !slices.Equal(waits, want) {
		t.Errorf("waits %v, want %v", waits, want)
	}
}

// TestAFullMemoryKeepsTheKeysOfItsDecision: when the memory is full, making room for one key of
// a decision never drops another key of the same decision, fetched just before: its admission
// would be recorded in a key no longer there, and the next request on it admitted again.
func TestAFullMemoryKeepsTheKeysOfItsDecision(t *testing.T) {
	log := newMemory(1)
	ps := []ratelimit.Policy{policy("login-ip", 1, time.Minute), policy("login-account", 1, time.Minute)}
	now := time.Unix(1_800_000_000, 0)
	if ok, _ := log.allow(now, []string{"ip", "document"}, ps); !ok {
		t.Fatal("the first login: refused")
	}
	if ok, _ := log.allow(now.Add(time.Second), []string{"ip"}, ps[:1]); ok {
		t.Error("the IP's second login within its window of 1: admitted, its first admission lost when the memory made room")
	}
}
