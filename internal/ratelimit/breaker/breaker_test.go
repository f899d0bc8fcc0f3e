package breaker

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pixlimit/pixlimit/internal/ratelimit"
	"github.com/pixlimit/pixlimit/internal/ratelimit/warm"
	"github.com/pixlimit/pixlimit/internal/testing/apitest"
	"github.com/pixlimit/pixlimit/internal/testing/redistest"
)

const budget = 100 * time.Millisecond

var testSecret = []byte("0123456789abcdef-breaker-tests")

// counting is a client that counts the scripts it sends: a call the breaker failed never gets
// here.
type counting struct {
	redis.UniversalClient
	sent, pings atomic.Int64
}

func (c *counting) Ping(ctx context.Context) *redis.StatusCmd {
	c.pings.Add(1)
	return c.UniversalClient.Ping(ctx)
}

func (c *counting) EvalSha(ctx context.Context, sha1 string, keys []string, args ...any) *redis.Cmd {
	c.sent.Add(1)
	return c.UniversalClient.EvalSha(ctx, sha1, keys, args...)
}

func (c *counting) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	c.sent.Add(1)
	return c.UniversalClient.Eval(ctx, script, keys, args...)
}

// limiter is a Limiter over a Breaker of threshold failures and cooldown around its own client
// of srv, logging to logger, and what the breaker's client sent.
func limiter(t *testing.T, srv *redistest.Server, failures int, cooldown time.Duration, logger *slog.Logger) (*ratelimit.Limiter, *Breaker, *counting) {
	t.Helper()
	inner := srv.Client(func(o *redis.Options) { ratelimit.ClientOptions(o, budget) })
	c := &counting{UniversalClient: inner}
	b, err := New(c, Options{Failures: failures, Cooldown: cooldown, Timeout: budget, Logger: logger,
		// The probe runs on the inner client: the count is of the calls the breaker let through.
		Probe: func(ctx context.Context, _ redis.Scripter) error { return ratelimit.Probe(ctx, inner, "") }})
	if err != nil {
		t.Fatal(err)
	}
	l, err := ratelimit.New(b, ratelimit.Options{KeySecret: testSecret, Timeout: budget})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return l, b, c
}

// warmLimiter makes l's first decision on c: connected, scripts loaded (three tries: on a busy
// machine the first can outlast the budget; two failures stay under the thresholds the tests set).
func warmLimiter(t *testing.T, l *ratelimit.Limiter, c ratelimit.Check) {
	t.Helper()
	for try := 1; ; try++ {
		if _, err := l.AllowAll(context.Background(), c); err == nil {
			return
		} else if try == 3 {
			t.Fatalf("warming up: %v", err)
		}
	}
}

// TestBreaker: decisions time out against a frozen Redis, the breaker opens and the next
// decisions fail at once, without asking Redis; after the cool-down it probes Redis in the
// background while decisions keep failing at once, and once Redis is back the probe closes it and
// decisions are made again. "At once" is counted, not timed: the open breaker's decisions leave
// the breaker's client's count of calls sent where it was, so none waited on the frozen server,
// however slow the machine.
func TestBreaker(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	var logs apitest.Logs
	const cooldown = 300 * time.Millisecond
	l, b, c := limiter(t, srv, 3, cooldown, slog.New(slog.NewTextHandler(&logs, nil)))
	check := ratelimit.Check{Policy: ratelimit.Policy{Name: "statement", Limit: 100, Window: time.Minute}, Identity: "ana"}
	warmLimiter(t, l, check)
	srv.Pause()
	// Three calls failing in a row open it, not two (this Limiter has no withdrawals, no
	// heartbeat: its only calls are these decisions), and each of them asked the frozen Redis.
	for i := range 3 {
		if b.Open() {
			t.Fatalf("open after %d failures, want 3", i)
		}
		start := time.Now()
		// A lower bound: a slower machine only waits longer.
		if _, err := l.AllowAll(context.Background(), check); err == nil || time.Since(start) < budget/2 {
			t.Fatalf("failure %d: %v after %v, want ErrUnavailable after the budget", i+1, err, time.Since(start))
		}
	}
	if !b.Open() {
		t.Fatal("three decisions failed and the breaker is still closed")
	}
	// Open, then half-open with the probe failing against the frozen Redis, over three
	// cool-downs at least: never a decision that asks Redis.
	asked := c.sent.Load()
	const tries = 100
	for start := time.Now(); time.Since(start) < 3*cooldown; {
		for range tries / 10 {
			if _, err := l.AllowAll(context.Background(), check); !errors.Is(err, ratelimit.ErrUnavailable) || !errors.Is(err, ErrOpen) {
				t.Fatalf("breaker open: %v, want ErrUnavailable", err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if sent, short := c.sent.Load(), b.ShortCircuited(); sent != asked || short < tries/10 || !b.Open() {
		t.Errorf("open %v, %d short-circuited, %d calls sent (%d before): want the breaker open, every decision short-circuited and none asking Redis",
			b.Open(), short, sent, asked)
	}
	srv.Resume()
	var d ratelimit.Decision
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if d, err = l.AllowAll(context.Background(), check); err == nil {
			break
		}
	}
	if err != nil || !d.Allowed || b.Open() {
		t.Fatalf("after Redis returned: %+v, %v, open %v; want decisions again after a cool-down and a probe", d, err, b.Open())
	}
	out := logs.String()
	for _, want := range []string{"rate limiter circuit open", "rate limiter circuit closed"} {
		if n := strings.Count(out, want); n != 1 {
			t.Errorf("%q logged %d times, want once:\n%s", want, n, out)
		}
	}
}

// TestBreakerProbesWhenTheCoolDownEnds: the probe starts on the cool-down's timer, with no request
// to start it; a failed probe sets another timer; a good one closes the breaker, so the first
// request after it asks Redis. (The breaker used to wait for a request to start its probe, and
// refused that request: on a quiet route, the first customer after every blip.)
func TestBreakerProbesWhenTheCoolDownEnds(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var timers []func()
	var waits []time.Duration
	results := make(chan error, 1)
	var probes atomic.Int64
	b := newBreaker(1, time.Second, time.Second, func(context.Context) error { probes.Add(1); return <-results },
		time.Now, slog.New(slog.DiscardHandler))
	b.after = func(d time.Duration, f func()) func() bool {
		mu.Lock()
		defer mu.Unlock()
		timers, waits = append(timers, f), append(waits, d)
		return func() bool { return true }
	}
	fire := func(i int) {
		t.Helper()
		mu.Lock()
		if len(timers) <= i {
			mu.Unlock()
			t.Fatalf("%d timers set, want %d", len(timers), i+1)
		}
		f := timers[i]
		mu.Unlock()
		f()
		b.probes.Wait()
	}
	b.failure()
	if b.allow() || probes.Load() != 0 {
		t.Fatal("allowed, or probed, during the cool-down")
	}
	results <- errors.New("still down")
	fire(0)
	if probes.Load() != 1 || b.closed.Load() {
		t.Fatalf("%d probes, closed %t; want 1 failed probe, still open", probes.Load(), b.closed.Load())
	}
	results <- nil
	fire(1) // the failed probe's new cool-down
	if probes.Load() != 2 || !b.allow() {
		t.Fatalf("%d probes, allow() false; want the second probe to have closed the breaker, and the next call asked", probes.Load())
	}
	if waits[0] != time.Second || waits[1] != time.Second {
		t.Errorf("timers of %v, want the cool-down each", waits)
	}
}

// TestTheFirstRequestAfterABlipIsDecided, in real time: Redis stalls, the breaker opens, Redis
// returns; a request that arrives a second later, with none in between, is decided by Redis,
// and Ready says so before it.
func TestTheFirstRequestAfterABlipIsDecided(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	l, b, _ := limiter(t, srv, 3, 300*time.Millisecond, slog.New(slog.DiscardHandler))
	check := ratelimit.Check{Policy: ratelimit.Policy{Name: "login-ip", Limit: 100, Window: time.Minute}, Identity: "quiet"}
	warmLimiter(t, l, check)
	srv.Pause()
	for range 3 {
		_, _ = l.AllowAll(context.Background(), check)
	}
	if err := b.Ready(context.Background()); err == nil || !b.Open() {
		t.Fatalf("Ready with the breaker open: %v, open %v; want ErrUnavailable", err, b.Open())
	}
	srv.Resume()
	time.Sleep(time.Second) // three cool-downs, no request
	if err := b.Ready(context.Background()); err != nil {
		t.Errorf("Ready a second after Redis returned: %v", err)
	}
	if d, err := l.AllowAll(context.Background(), check); err != nil || !d.Allowed {
		t.Errorf("the first request after the blip: %+v, %v; want Redis to decide it", d, err)
	}
}

// TestBreakerProbesOneAtATime: once the cool-down is over, the first call starts one probe and
// every call fails at once meanwhile; a failed probe reopens the breaker, a good one closes it.
func TestBreakerProbesOneAtATime(t *testing.T) {
	t.Parallel()
	now := time.Now()
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	results := make(chan error, 1) // a probe that never started fails the count below, not a hang here
	var probes atomic.Int64
	b := newBreaker(1, time.Second, time.Second, func(context.Context) error { probes.Add(1); return <-results }, clock, slog.New(slog.DiscardHandler))
	b.after = func(time.Duration, func()) func() bool { return func() bool { return true } } // no timer: calls start the probe
	b.failure()
	advance(999 * time.Millisecond)
	if b.allow() || probes.Load() != 0 {
		t.Fatal("allowed, or probed, during the cool-down")
	}
	advance(time.Millisecond)
	for range 10 {
		if b.allow() {
			t.Fatal("allowed while the probe runs")
		}
	}
	results <- errors.New("still down")
	b.probes.Wait()
	if probes.Load() != 1 {
		t.Fatalf("%d probes, want 1", probes.Load())
	}
	advance(500 * time.Millisecond)
	if b.allow() {
		t.Fatal("allowed during the second cool-down")
	}
	advance(500 * time.Millisecond)
	b.allow()
	results <- nil
	b.probes.Wait()
	if !b.allow() || !b.allow() {
		t.Fatal("refused after a good probe")
	}
}

// TestWarmDialsThroughTheBreaker: a Limiter over a Breaker warms its pool as over the bare client
// (warm.Up dials its connections, a PING each at once, through the client it is given): a
// burst after it finds them dialed. (Counted by PINGs: how many connections they open depends on
// how they overlap.)
func TestWarmDialsThroughTheBreaker(t *testing.T) {
	t.Parallel()
	_, b, c := limiter(t, redistest.Start(t), 5, time.Second, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := warm.Up(ctx, b, 8); err != nil {
		t.Fatal(err)
	}
	if got := c.pings.Load(); got != 8 {
		t.Errorf("warm.Up pinged %d times through the breaker, want 8 (one per connection it opens)", got)
	}
}

// TestALateFailureStartsNoSecondProbe: a decision sent before the breaker opened and failing while
// its probe runs says nothing new: it neither restarts the cool-down nor lets a second probe
// start beside the one in flight (one probe at a time, however its timeout compares with the
// cool-down).
func TestALateFailureStartsNoSecondProbe(t *testing.T) {
	t.Parallel()
	release := make(chan struct{}) // every probe succeeds once it is closed
	var probes atomic.Int64
	b := newBreaker(1, time.Second, 10*time.Second, func(context.Context) error { probes.Add(1); <-release; return nil },
		time.Now, slog.New(slog.DiscardHandler))
	var timers atomic.Int64
	b.after = func(time.Duration, func()) func() bool { timers.Add(1); return func() bool { return true } }
	b.failure() // opens it: one cool-down's timer
	b.startProbe()
	for probes.Load() == 0 { // the probe runs, waiting for its result
		time.Sleep(time.Millisecond)
	}
	b.failure()    // a late one
	b.startProbe() // as a timer the late failure would have set, or a call after the cool-down
	close(release)
	b.probes.Wait()
	if n, tm := probes.Load(), timers.Load(); n != 1 || tm != 1 || !b.allow() {
		t.Errorf("%d probes, %d cool-downs, closed %t; want 1 probe, 1 cool-down, closed by the probe", n, tm, b.allow())
	}
}

// probing is a breaker opened by one failure whose probe is on its way, failing once release is
// closed, and the count of its probes.
func probing(t *testing.T) (b *breaker, probes *atomic.Int64, release chan struct{}) {
	t.Helper()
	release, probes = make(chan struct{}), new(atomic.Int64)
	b = newBreaker(1, time.Second, 10*time.Second, func(context.Context) error { probes.Add(1); <-release; return errors.New("timed out") },
		time.Now, slog.New(slog.DiscardHandler))
	b.after = func(time.Duration, func()) func() bool { return func() bool { return true } } // no timer: the test starts the probes
	b.failure()
	b.startProbe()
	for probes.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	return b, probes, release
}

// TestAProbeOutlastingACloseIsStillTheOne: a probe still on its way when a decision Redis
// answered closed the breaker, and failures opened it again, is still the one probe: the new
// cool-down's end starts no second beside it (a cool-down shorter than a probe's timeout).
func TestAProbeOutlastingACloseIsStillTheOne(t *testing.T) {
	t.Parallel()
	b, probes, release := probing(t)
	b.success()    // a decision Redis answered meanwhile
	b.failure()    // and one it did not: open again
	b.startProbe() // the new cool-down's timer
	close(release)
	b.probes.Wait()
	if n := probes.Load(); n != 1 || b.allow() {
		t.Errorf("%d probes, closed %t; want 1 probe, whose failure leaves the breaker open", n, b.allow())
	}
}

// TestAStaleProbeDoesNotReopenTheBreaker: a probe sent while Redis was down that fails after the
// breaker closed meanwhile (Ready, or a decision Redis answered) leaves it closed: the replica
// that says it is ready decides.
func TestAStaleProbeDoesNotReopenTheBreaker(t *testing.T) {
	t.Parallel()
	b, _, release := probing(t)
	b.success() // Redis answered meanwhile
	close(release)
	b.probes.Wait()
	if !b.allow() {
		t.Error("the breaker, closed by a success, reopened by the failure of a probe sent before it")
	}
}
