package ratelimit

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/pixlimit/pixlimit/internal/testing/redistest"
)

// TestAllowFallbackDecidesAtItsShare: with a fleet of 3, a limit of 10 is 4 per window in each
// replica's memory, as an exact sliding log: 4 admitted, the 5th refused until exactly when the
// oldest leaves the window; two keys are decided together; the log forgets everything once
// Redis answers again; and its memory is bounded by FallbackLogSize.
func TestAllowFallbackDecidesAtItsShare(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := srv.Client(nil)
	l, err := New(c, Options{KeySecret: testSecret, Timeout: generous, FallbackLogSize: 100})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	l.fleet.Store(3)
	clk := withClock(l)
	p := policy("statement", 10, time.Minute)
	for i := range 4 {
		if d := l.AllowFallback(context.Background(), Check{p, "ana"}); !d.Allowed || !d.Fallback || d.Worst.Capacity != 4 || d.Worst.Remaining != 3-i {
			t.Fatalf("local %d: %+v, want admitted, 4 of the share, %d left", i+1, d, 3-i)
		}
		clk.Add(time.Second)
	}
	d := l.AllowFallback(context.Background(), Check{p, "ana"})
	if d.Allowed || d.Worst.RetryAfter != 56*time.Second || d.Worst.Policy.Limit != 4 {
		t.Fatalf("the 5th: %+v, want refused until the oldest leaves: 56s", d.Worst)
	}
	clk.Add(56*time.Second - time.Microsecond)
	if l.AllowFallback(context.Background(), Check{p, "ana"}).Allowed {
		t.Fatal("admitted before Retry-After")
	}
	clk.Add(time.Microsecond)
	if !l.AllowFallback(context.Background(), Check{p, "ana"}).Allowed {
		t.Fatal("refused at Retry-After")
	}
	ip, doc := policy("login-ip", 10, time.Minute), policy("login-account", 5, time.Minute) // shares 4 and 2
	for range 2 {
		l.AllowFallback(context.Background(), Check{ip, "1.2.3.4"}, Check{doc, "cpf"})
	}
	if d := l.AllowFallback(context.Background(), Check{ip, "1.2.3.4"}, Check{doc, "cpf"}); d.Allowed || d.Results[0].Remaining != 2 {
		t.Errorf("two keys, the document's share (2) used: %+v, want refused, the IP key untouched at 2 left", d)
	}
	for i := range 500 {
		l.AllowFallback(context.Background(), Check{p, fmt.Sprint("flood-", i)})
	}
	if n := l.fallback.size(); n > 100 {
		t.Errorf("%d keys in the fallback log, want at most FallbackLogSize (100)", n)
	}
	l.down.Store(true) // as after a failed decision
	mustAllow(t, l, Check{p, "ana"})
	if n := l.fallback.size(); n != 0 {
		t.Errorf("%d keys in the fallback log after Redis answered, want none", n)
	}
}

// TestTheHeartbeatCountsTheFleet: three Limiters with a FleetSize floor of 2 beat in one Redis;
// within a few beats each counts 3.
func TestTheHeartbeatCountsTheFleet(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	var ls []*Limiter
	for range 3 {
		l, err := New(srv.Client(nil), Options{KeySecret: testSecret, Timeout: generous, FleetSize: 2})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		ls = append(ls, l)
	}
	deadline := time.Now().Add(5 * heartbeatEvery)
	for _, l := range ls {
		for l.Stats().FleetSize != 3 && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if got := l.Stats().FleetSize; got != 3 {
			t.Errorf("fleet size %d after %v, want 3", got, 5*heartbeatEvery)
		}
	}
}

// TestFallbackLogMemory measures what the fallback log costs per identity: 10,000 keys with a share of
// 4 admissions each (statement 30 a minute over 8 replicas), as a flood during an outage fills it.
//
//	go test -run TestFallbackLogMemory -v ./internal/ratelimit
func TestFallbackLogMemory(t *testing.T) {
	log := newFallbackLog(10_000)
	p := Policy{Name: "statement", Limit: 4, Window: time.Minute}
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
			log.allow(now.Add(time.Duration(i*4+j)*time.Microsecond), []string{k}, []Policy{p})
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
