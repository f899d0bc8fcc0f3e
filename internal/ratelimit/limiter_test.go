package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pixlimit/pixlimit/internal/testing/clocktest"
	"github.com/pixlimit/pixlimit/internal/testing/redistest"
	"github.com/pixlimit/pixlimit/internal/testing/stalls"
)

var testSecret = []byte("0123456789abcdef0123456789abcdef")

// budget is the decision budget of the outage tests, which measure it. The others use a
// generous one, since a loaded CI machine can exceed 100ms and a timeout is not what they test.
const (
	budget   = 100 * time.Millisecond
	generous = time.Second
)

// replicas returns n Limiters, each with its own client of srv: stand-ins for API replicas.
func replicas(t *testing.T, srv *redistest.Server, n int, timeout time.Duration) []*Limiter {
	t.Helper()
	ls := make([]*Limiter, n)
	for i := range ls {
		c := srv.Client(func(o *redis.Options) { ClientOptions(o, timeout) })
		l, err := New(c, Options{KeySecret: testSecret, Timeout: timeout})
		if err != nil {
			t.Fatal(err)
		}
		ls[i] = l
	}
	return ls
}

// meters are the algorithms that answer at once, every one but the queue: the tests of a limit's
// arithmetic over several keys run on them; the queue has its own (queue_test.go).
func meters() []Algorithm {
	return slices.DeleteFunc(Algorithms(), func(a Algorithm) bool { return a == LeakyBucket })
}

func newTestLimiter(t *testing.T) (*Limiter, *redis.Client, *redistest.Server) {
	t.Helper()
	srv := redistest.Start(t)
	l := replicas(t, srv, 1, generous)[0]
	return l, srv.Client(nil), srv
}

// clock is an injected time for the script, so tests step through windows without sleeping.
type clock = clocktest.Clock

func withClock(l *Limiter) *clock {
	c := clocktest.New()
	l.now = c.Now
	return c
}

func mustAllow(t *testing.T, l *Limiter, checks ...Check) Decision {
	t.Helper()
	d, err := l.AllowAll(context.Background(), checks...)
	if err != nil {
		t.Fatalf("AllowAll: %v", err)
	}
	return d
}

// warm makes l's first decision on c: connected, scripts loaded. On a busy CI machine that first
// one (a dial, a script load) can outlast a tight budget, so it gets three tries; two failures
// in a row stay under every breaker threshold the tests set, and a late admission is withdrawn
// by id as any late one is.
func warm(t *testing.T, l *Limiter, c Check) {
	t.Helper()
	for try := 1; ; try++ {
		if _, err := l.AllowAll(context.Background(), c); err == nil {
			return
		} else if try == 3 {
			t.Fatalf("warming up: %v", err)
		}
	}
}

func policy(name string, limit int, window time.Duration) Policy {
	return Policy{Name: name, Limit: limit, Window: window}
}

func TestReplicasAdmitExactlyTheLimit(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	ls := replicas(t, srv, 3, generous)
	pix := policy("pix", 10, time.Minute)
	ip, doc := policy("login-ip", 10, time.Minute), policy("login-account", 5, time.Minute)

	tests := []struct {
		name   string
		checks []Check
		want   int
	}{
		{"one key", []Check{{pix, "acct-1"}}, 10},
		{"two keys, the smaller limit binds", []Check{{ip, "198.51.100.7"}, {doc, "52998224725"}}, 5},
		{"two keys, the other binds", []Check{{doc, "39053344705"}, {policy("wide", 3, time.Minute), "x"}}, 3},
	}
	for _, tt := range tests {
		var allowed, refused atomic.Int64
		var wg sync.WaitGroup
		for g := range 50 {
			wg.Go(func() {
				d, err := ls[g%len(ls)].AllowAll(context.Background(), tt.checks...)
				if err != nil {
					t.Errorf("%s: %v", tt.name, err)
					return
				}
				if d.Allowed {
					allowed.Add(1)
				} else {
					refused.Add(1)
				}
			})
		}
		wg.Wait()
		if got := allowed.Load(); got != int64(tt.want) {
			t.Errorf("%s: 50 concurrent requests over 3 replicas: %d admitted, want exactly %d", tt.name, got, tt.want)
		}
		if got := refused.Load(); got != int64(50-tt.want) {
			t.Errorf("%s: %d refused, want %d", tt.name, got, 50-tt.want)
		}
	}
}

func TestRefusalByOneKeyRecordsNothingInTheOther(t *testing.T) {
	t.Parallel()
	l, rdb, _ := newTestLimiter(t)
	withClock(l)
	ip, doc := policy("login-ip", 10, time.Minute), policy("login-account", 2, time.Minute)
	full := Check{doc, "11144477735"}
	for range 2 {
		mustAllow(t, l, full)
	}
	other := Check{ip, "203.0.113.9"}
	for i := range 5 {
		d := mustAllow(t, l, other, full)
		if d.Allowed {
			t.Fatalf("request %d admitted with the document key full", i)
		}
		if got, want := d.Worst.Policy.Name, "login-account"; got != want {
			t.Errorf("worst policy = %q, want %q", got, want)
		}
		if got, want := d.Results[0].Remaining, 10; got != want {
			t.Errorf("IP key remaining = %d, want %d (nothing recorded)", got, want)
		}
	}
	n, err := rdb.ZCard(context.Background(), l.keys.key(ip, other.Identity)).Result()
	if err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("IP key holds %d entries after 5 refusals by the document key, want 0", n)
	}
}

func TestWorstKeyIsReported(t *testing.T) {
	t.Parallel()
	l, _, _ := newTestLimiter(t)
	clk := withClock(l)
	a, b := policy("a", 4, time.Minute), policy("b", 4, 2*time.Minute)
	mustAllow(t, l, Check{a, "x"}) // a: 1 entry at t0
	clk.Add(10 * time.Second)
	d := mustAllow(t, l, Check{a, "x"}, Check{b, "x"}) // a: 2 entries, b: 1
	if got, want := d.Worst.Policy.Name, "a"; got != want {
		t.Errorf("worst = %q, want %q (fewer remaining)", got, want)
	}
	if got, want := d.Worst.Remaining, 2; got != want {
		t.Errorf("remaining = %d, want %d", got, want)
	}
	if got, want := d.Worst.Reset, 50*time.Second; got != want {
		t.Errorf("reset = %v, want %v (oldest entry of a leaves the window)", got, want)
	}
	mustAllow(t, l, Check{b, "x"}) // a: 2, b: 2: tie on remaining, b resets later
	d = mustAllow(t, l, Check{a, "x"}, Check{b, "x"})
	if got, want := d.Worst.Policy.Name, "b"; got != want {
		t.Errorf("on a tie, worst = %q, want %q (longer reset)", got, want)
	}
}

// TestNoBoundaryBurst drives random traffic through many windows and checks the defining
// property of a sliding window: any interval one window long admits at most the limit.
func TestNoBoundaryBurst(t *testing.T) {
	t.Parallel()
	l, _, _ := newTestLimiter(t)
	clk := withClock(l)
	p := policy("pix", 10, time.Minute)
	rng := rand.New(rand.NewPCG(1, 2))

	// The classic attack on a fixed window: the limit just before a boundary, again just after.
	clk.Add(59 * time.Second)
	for range 10 {
		if !mustAllow(t, l, Check{p, "burst"}).Allowed {
			t.Fatal("first 10 refused")
		}
	}
	clk.Add(2 * time.Second)
	for i := range 10 {
		if mustAllow(t, l, Check{p, "burst"}).Allowed {
			t.Fatalf("request %d admitted 2s after 10 others: a 2x burst across the boundary", i)
		}
	}

	var admitted []time.Time
	for range 3000 {
		clk.Add(time.Duration(rng.IntN(4000)) * time.Millisecond)
		if mustAllow(t, l, Check{p, "random"}).Allowed {
			admitted = append(admitted, clk.Now())
		}
	}
	for i, start := range admitted {
		j := sort.Search(len(admitted), func(j int) bool { return !admitted[j].Before(start.Add(p.Window)) })
		if n := j - i; n > p.Limit {
			t.Fatalf("%d requests admitted in the window starting at request %d, want at most %d", n, i, p.Limit)
		}
	}
	// 3000 requests 2s apart on average span about 100 windows: at most about 1000 fit.
	if len(admitted) < 900 {
		t.Fatalf("only %d of 3000 admitted: the limiter refused more than the limit asks", len(admitted))
	}
}

func TestInsistingDoesNotExtendTheBlock(t *testing.T) {
	t.Parallel()
	l, _, _ := newTestLimiter(t)
	clk := withClock(l)
	p := policy("pix", 10, time.Minute)
	c := Check{p, "ana"}
	for i := range 10 {
		clk.Add(time.Second) // admitted at t0+1s … t0+10s
		if d := mustAllow(t, l, c); !d.Allowed || d.Worst.Remaining != 9-i {
			t.Fatalf("request %d: allowed=%v remaining=%d, want true, %d", i, d.Allowed, d.Worst.Remaining, 9-i)
		}
	}
	t0 := clk.Now()
	d := mustAllow(t, l, c)
	if d.Allowed {
		t.Fatal("11th request admitted")
	}
	unblock := t0.Add(d.Worst.RetryAfter)
	if got, want := d.Worst.RetryAfter, 51*time.Second; got != want {
		t.Fatalf("RetryAfter = %v, want %v (first entry at t0-9s leaves the 60s window)", got, want)
	}
	for range 200 { // hammer the full key: the unblock time never moves
		clk.Add(250 * time.Millisecond)
		d := mustAllow(t, l, c)
		if d.Allowed {
			t.Fatalf("admitted at %v, before the unblock time %v", clk.Now().Sub(t0), unblock.Sub(t0))
		}
		if got := clk.Now().Add(d.Worst.RetryAfter); !got.Equal(unblock) {
			t.Fatalf("hammering moved the unblock time to %v, want %v", got.Sub(t0), unblock.Sub(t0))
		}
	}
	clk.Set(unblock.Add(-time.Microsecond))
	if mustAllow(t, l, c).Allowed {
		t.Fatal("admitted 1µs before RetryAfter elapsed")
	}
	clk.Set(unblock)
	if !mustAllow(t, l, c).Allowed {
		t.Fatal("refused when RetryAfter elapsed")
	}
	if d := mustAllow(t, l, c); d.Allowed {
		t.Fatal("two admitted when RetryAfter elapsed, want exactly one")
	} else if got, want := d.Worst.RetryAfter, time.Second; got != want {
		t.Errorf("next RetryAfter = %v, want %v (the second entry is 1s younger)", got, want)
	}
}

func TestSameMicrosecondBothCount(t *testing.T) {
	t.Parallel()
	l, _, _ := newTestLimiter(t)
	withClock(l) // the clock never moves: every request in the same microsecond
	p := policy("pix", 5, time.Minute)
	for i := range 5 {
		if d := mustAllow(t, l, Check{p, "ana"}); !d.Allowed || d.Worst.Remaining != 4-i {
			t.Fatalf("request %d: allowed=%v remaining=%d, want true, %d", i, d.Allowed, d.Worst.Remaining, 4-i)
		}
	}
	if mustAllow(t, l, Check{p, "ana"}).Allowed {
		t.Fatal("6th request in the same microsecond admitted")
	}
}

func TestEveryKeyHasATTLWithinItsWindow(t *testing.T) {
	t.Parallel()
	l, rdb, _ := newTestLimiter(t)
	ctx := context.Background()
	windows := map[string]time.Duration{"pix": time.Minute, "login-ip": 10 * time.Minute, "login-account": 10 * time.Minute}
	for i := range 30 {
		mustAllow(t, l, Check{policy("pix", 3, windows["pix"]), fmt.Sprint("acct-", i%4)})
		mustAllow(t, l, Check{policy("login-ip", 4, windows["login-ip"]), "ip"},
			Check{policy("login-account", 2, windows["login-account"]), fmt.Sprint("doc-", i%3)})
	}
	keys, err := rdb.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 4+1+3 {
		t.Fatalf("%d keys, want 8: %v", len(keys), keys)
	}
	for _, k := range keys {
		ttl, err := rdb.PTTL(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		var name string
		fmt.Sscanf(k, "rl:%s", &name)
		w := windows[name[:len(name)-len(":{0123456789012345678901}")]]
		if ttl <= 0 || ttl > w {
			t.Errorf("key %s: TTL %v, want in (0, %v]", k, ttl, w)
		}
	}
}

// TestRedisClock uses Redis TIME, as production does, with a short real window.
func TestRedisClock(t *testing.T) {
	t.Parallel()
	l, _, _ := newTestLimiter(t)
	p := policy("short", 3, time.Second) // three decisions fit in it on any machine
	for range 3 {
		if !mustAllow(t, l, Check{p, "x"}).Allowed {
			t.Fatal("refused under the limit")
		}
	}
	d := mustAllow(t, l, Check{p, "x"})
	if d.Allowed || d.Worst.RetryAfter <= 0 || d.Worst.RetryAfter > p.Window {
		t.Fatalf("4th: allowed=%v RetryAfter=%v, want refused with 0 < RetryAfter <= %v", d.Allowed, d.Worst.RetryAfter, p.Window)
	}
	time.Sleep(d.Worst.RetryAfter + 5*time.Millisecond)
	if !mustAllow(t, l, Check{p, "x"}).Allowed {
		t.Fatal("refused after RetryAfter elapsed")
	}
}

func TestOutageIsDecidedWithinBudget(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	l := replicas(t, srv, 1, budget)[0]
	c := Check{policy("pix", 10, time.Minute), "ana"}
	warm(t, l, c)
	meter := stalls.Watch(t)

	outage := func(what string) {
		t.Helper()
		for range 3 {
			start := time.Now()
			_, err := l.AllowAll(context.Background(), c)
			elapsed := meter.Took(start)
			if !errors.Is(err, ErrUnavailable) {
				t.Fatalf("%s: err = %v, want ErrUnavailable", what, err)
			}
			if elapsed > budget+50*time.Millisecond {
				t.Errorf("%s: decision took %v, want within the %v budget", what, elapsed, budget)
			}
		}
	}
	srv.Pause()
	outage("paused server")
	srv.Resume()
	if !mustAllow(t, l, c).Allowed {
		t.Fatal("refused after resume")
	}
	srv.Kill()
	outage("killed server")
	srv.Restart()
	if d := mustAllow(t, l, c); !d.Allowed || d.Worst.Remaining != 9 {
		t.Fatalf("after restart: allowed=%v remaining=%d, want true, 9 (an empty server)", d.Allowed, d.Worst.Remaining)
	}
}

func TestPolicyValidation(t *testing.T) {
	t.Parallel()
	tests := []struct {
		p     Policy
		field string // "" for a valid policy
	}{
		{Policy{Name: "pix", Limit: 10, Window: time.Minute}, ""},
		{Policy{Name: "pix", Limit: 10, Window: time.Minute, Algorithm: GCRA, Burst: 20}, ""},
		{Policy{Name: "", Limit: 1, Window: time.Second}, "Name"},
		{Policy{Name: "Pix", Limit: 1, Window: time.Second}, "Name"},
		{Policy{Name: "a b", Limit: 1, Window: time.Second}, "Name"},
		{Policy{Name: "pix", Limit: 0, Window: time.Second}, "Limit"},
		{Policy{Name: "pix", Limit: 1, Window: 0}, "Window"},
		{Policy{Name: "pix", Limit: 1, Window: 1500 * time.Microsecond}, "Window"},
		{Policy{Name: "pix", Limit: 1, Window: time.Second, Algorithm: "leaky"}, "Algorithm"},
		{Policy{Name: "pix", Limit: 1, Window: time.Second, Burst: 5}, "Burst"},
		{Policy{Name: "pix", Limit: 1, Window: time.Second, Algorithm: TokenBucket, Burst: -1}, "Burst"},
		{Policy{Name: "pix", Limit: 1 << 30, Window: 24 * time.Hour, Algorithm: SlidingWindow}, "Limit"},
		{Policy{Name: "pix", Limit: 5, Window: 28 * time.Minute, Algorithm: SlidingLogPacked}, ""},
		{Policy{Name: "pix", Limit: 5, Window: 28*time.Minute + time.Millisecond, Algorithm: SlidingLogPacked}, "Window"},
		{Policy{Name: "Pix", Limit: 0, Window: time.Second}, "Name Limit"}, // every problem, not the first

	}
	for _, tt := range tests {
		var fields []string
		if joined, ok := tt.p.Validate().(interface{ Unwrap() []error }); ok {
			for _, err := range joined.Unwrap() {
				var pe *PolicyError
				if !errors.As(err, &pe) {
					t.Fatalf("%+v: %v is not a *PolicyError", tt.p, err)
				}
				fields = append(fields, pe.Field)
			}
		}
		if got := strings.Join(fields, " "); got != tt.field {
			t.Errorf("%+v: problems with %q, want %q", tt.p, got, tt.field)
		}
	}
	a, b := policy("a", 1, time.Second), policy("b", 1, time.Second)
	if err := ValidateTogether(a, b); err != nil {
		t.Errorf("two sliding logs: %v", err)
	}
	b.Algorithm = GCRA
	if err := ValidateTogether(a, b); err == nil {
		t.Error("a sliding log with a GCRA in one decision: want an error")
	}
	if _, err := New(redis.NewClient(&redis.Options{}), Options{KeySecret: []byte("short")}); err == nil {
		t.Error("New with a 5-byte secret: want an error")
	}
}

// TestChargeStepPaysInAdvance: a token bucket of 100, refilled 2 a minute, as the PIX key look-up
// uses it. A look-up asks first (a cost of 0 takes nothing), then pays its price: 1 for a hit,
// 20 for a miss. Five misses empty it, the next look-up is refused, and the refill pays back at
// 2 a minute.
func TestChargeStepPaysInAdvance(t *testing.T) {
	t.Parallel()
	l, _, _ := newTestLimiter(t)
	clk := withClock(l)
	ctx := context.Background()
	p := Policy{Name: "pix-lookup", Limit: 2, Window: time.Minute, Algorithm: TokenBucket, Burst: 100}
	c := Check{p, "acct-ana"}
	allowN := func(n int) Decision {
		t.Helper()
		d, err := lastOf(l.Decide(ctx, ChargeStep(c, n)))
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	if d := allowN(0); !d.Allowed || d.Worst.Remaining != 100 {
		t.Fatalf("asking: %+v, want allowed with 100 left, nothing taken", d.Worst)
	}
	if d := allowN(1); !d.Allowed || d.Worst.Remaining != 99 {
		t.Fatalf("a hit: %+v, want allowed with 99 left", d.Worst)
	}
	for i := range 5 {
		d := allowN(20)
		if want := max(0, 99-20*(i+1)); !d.Allowed || d.Worst.Remaining != want {
			t.Errorf("miss %d: %+v, want allowed with %d left", i+1, d.Worst, want)
		}
	}
	d := allowN(0) // 99 - 100 = -1: in debt
	if d.Allowed || d.Worst.RetryAfter != time.Minute {
		t.Fatalf("after five misses: %+v, want refused for a minute (1 token of debt + 1 token, at 2 a minute)", d.Worst)
	}
	clk.Add(time.Minute - time.Microsecond)
	if allowN(20).Allowed {
		t.Fatal("admitted before the refill paid the debt")
	}
	clk.Add(time.Microsecond)
	if d := allowN(0); !d.Allowed || d.Worst.Remaining != 1 {
		t.Fatalf("after a minute, asking: %+v, want allowed with 1 left", d.Worst)
	}
	if d := mustAllow(t, l, c); !d.Allowed || d.Worst.Remaining != 0 {
		t.Fatalf("after a minute: %+v, want allowed with nothing left", d.Worst)
	}
	if _, err := lastOf(l.Decide(ctx, ChargeStep(Check{policy("pix", 10, time.Minute), "x"}, 5))); err == nil {
		t.Error("a cost on a sliding log: no error")
	}
	if _, err := lastOf(l.Decide(ctx, ChargeStep(c, -1))); err == nil {
		t.Error("a negative cost: no error")
	}
}

// TestConcurrentCostsBuyNoMoreThanSequentialOnes: 60 look-ups at once, each a miss (20 of a
// bucket of 100): exactly 5 are admitted, as one by one. Paying one token and the rest after the
// answer let 11 through in the audit.
func TestConcurrentCostsBuyNoMoreThanSequentialOnes(t *testing.T) {
	t.Parallel()
	l, _, _ := newTestLimiter(t)
	p := Policy{Name: "pix-lookup", Limit: 2, Window: time.Minute, Algorithm: TokenBucket, Burst: 100}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range 60 {
		wg.Go(func() {
			d, err := lastOf(l.Decide(context.Background(), ChargeStep(Check{p, "acct-scanner"}, 20)))
			if err != nil {
				t.Error(err)
			}
			if d.Allowed {
				admitted.Add(1)
			}
		})
	}
	wg.Wait()
	if got := admitted.Load(); got != 5 {
		t.Errorf("%d of 60 concurrent misses admitted, want 5", got)
	}
}

// TestRefundGivesTokensBackUpToCapacity: a bucket of 3 emptied by three requests admits a fourth
// once one token is given back, and no more; refunds to a full bucket leave it at its capacity;
// the deny cache that learned the bucket was empty forgets it at the refund; and a refund is
// never refused, even to a bucket in debt, which stays refused until refilled.
func TestRefundGivesTokensBackUpToCapacity(t *testing.T) {
	t.Parallel()
	l, _, _ := newTestLimiter(t)
	withClock(l) // time stands still: no refill
	ctx := context.Background()
	c := Check{Policy{Name: "pix-lookup", Limit: 2, Window: time.Minute, Algorithm: TokenBucket, Burst: 3}, "payer"}
	refund := func(n int) Decision {
		t.Helper()
		d, err := lastOf(l.Decide(ctx, RefundStep(n, c)))
		if err != nil || !d.Allowed {
			t.Fatalf("Refund(%d) = %+v, %v; want allowed", n, d, err)
		}
		return d
	}
	if d := refund(5); d.Worst.Remaining != 3 {
		t.Fatalf("a refund to a full bucket: %d left, want 3 (its capacity)", d.Worst.Remaining)
	}
	for range 3 {
		mustAllow(t, l, c)
	}
	if d := mustAllow(t, l, c); d.Allowed {
		t.Fatalf("the fourth: %+v, want refused", d)
	}
	if d := refund(1); d.Worst.Remaining != 1 {
		t.Fatalf("after a refund of 1: %d left, want 1", d.Worst.Remaining)
	}
	if d := mustAllow(t, l, c); !d.Allowed {
		t.Fatalf("after the refund: %+v, want admitted", d)
	}
	if d := mustAllow(t, l, c); d.Allowed {
		t.Fatal("two admitted after a refund of one")
	}
	if _, err := lastOf(l.Decide(ctx, ChargeStep(c, 20))); err != nil { // refused (empty): takes nothing
		t.Fatal(err)
	}
	refund(1)
	if d, _ := lastOf(l.Decide(ctx, ChargeStep(c, 20))); !d.Allowed { // 1 - 20 = -19
		t.Fatal("a miss with one token: refused")
	}
	if d := refund(1); d.Worst.Remaining != 0 {
		t.Fatalf("a refund into debt: %d left, want 0 (-18 tokens)", d.Worst.Remaining)
	}
	if d := mustAllow(t, l, c); d.Allowed {
		t.Fatal("admitted while in debt")
	}
	// Two buckets in one refund: both gain a token.
	other := Check{c.Policy, "payer-2"}
	for range 3 {
		mustAllow(t, l, other)
	}
	if d, err := lastOf(l.Decide(ctx, RefundStep(2, c, other))); err != nil || !d.Allowed || d.Results[1].Remaining != 2 {
		t.Fatalf("a refund of 2 to two buckets: %+v, %v; want the second at 2", d, err)
	}
	for _, bad := range []struct {
		c Check
		n int
	}{{c, 0}, {c, -1}, {Check{policy("pix", 10, time.Minute), "x"}, 1}} {
		if _, err := lastOf(l.Decide(ctx, RefundStep(bad.n, bad.c))); err == nil {
			t.Errorf("Refund(%s, %d): no error", bad.c.Policy.Name, bad.n)
		}
	}
}

// lastOf is the decision of a Decide of one step (its last); errOf its error alone; okOf whether
// it admitted.
func lastOf(ds Decisions, err error) (Decision, error) { return ds.Last(), err }
func errOf(_ Decisions, err error) error               { return err }
func okOf(ds Decisions, err error) (bool, error)       { return ds.Last().Allowed, err }

// TestWithdrawTakesAnAdmissionBack: a key full of three, one admission withdrawn, admits one
// more, and only one, whatever the algorithm; a refusal recorded nothing and withdraws nothing.
func TestWithdrawTakesAnAdmissionBack(t *testing.T) {
	for _, a := range meters() {
		t.Run(string(a), func(t *testing.T) {
			t.Parallel()
			l, _, _ := newTestLimiter(t)
			withClock(l)
			c := Check{Policy{Name: "p", Limit: 3, Window: time.Minute, Algorithm: a}, "acct"}
			var last Decision
			for range 3 {
				last = mustAllow(t, l, c)
			}
			refused := mustAllow(t, l, c)
			if !last.Allowed || refused.Allowed {
				t.Fatalf("three admitted then a refusal: %v, %v", last.Allowed, refused.Allowed)
			}
			for _, d := range []Decision{refused, last} {
				if err := l.Withdraw(t.Context(), d); err != nil {
					t.Fatal(err)
				}
			}
			again, more := mustAllow(t, l, c), mustAllow(t, l, c)
			if !again.Allowed || more.Allowed {
				t.Errorf("after a withdrawal: %v then %v, want one more admitted, and one only", again.Allowed, more.Allowed)
			}
		})
	}
}
