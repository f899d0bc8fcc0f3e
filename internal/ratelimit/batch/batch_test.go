package batch

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pixlimit/pixlimit/internal/ratelimit"
	"github.com/pixlimit/pixlimit/internal/testing/redistest"
	"github.com/pixlimit/pixlimit/internal/testing/stalls"
)

type (
	Algorithm = ratelimit.Algorithm
	Check     = ratelimit.Check
	Policy    = ratelimit.Policy
	Reply     = ratelimit.Reply
)

var testSecret = []byte("0123456789abcdef-batch-tests")

const generous = time.Second

// replica returns a Limiter over its own client of srv that batches (by max; 1: not at all),
// and its Runner.
func replica(t *testing.T, srv *redistest.Server, max int) (*ratelimit.Limiter, ratelimit.Runner) {
	t.Helper()
	c := srv.Client(func(o *redis.Options) { ratelimit.ClientOptions(o, generous) })
	r := New(c, ratelimit.Scripts(c), max)
	l, err := ratelimit.New(c, ratelimit.Options{KeySecret: testSecret, Timeout: generous, Runner: r})
	if err != nil {
		t.Fatal(err)
	}
	return l, r
}

// member is one decision of checks at now (µs; 0: the Redis clock), waiting for a batch.
func member(l *ratelimit.Limiter, now int64, checks ...Check) *pending {
	keys := make([]string, len(checks))
	for i, c := range checks {
		keys[i] = l.Key(c)
	}
	c := ratelimit.NewCall(checks...)
	c.Now = now
	return &pending{ctx: context.Background(), keys: keys, c: c, done: make(chan batchResult, 1)}
}

// TestBatchesDecideAsOneByOne: for every algorithm, a random trace of 3,000 decisions (40
// identities, one- and two-key decisions, time stepping by random amounts) is decided twice, on
// two Redis servers at the same injected times: one by one with the algorithm's script, and in
// random batches of 1 to 12 with its batch script. Every decision's reply is the same, member by
// member: a batch decides exactly as its members sent one by one in that order.
func TestBatchesDecideAsOneByOne(t *testing.T) {
	t.Parallel()
	for _, a := range ratelimit.Algorithms() {
		t.Run(string(a), func(t *testing.T) {
			t.Parallel()
			alone, lone := replica(t, redistest.Start(t), 1)
			batched, runner := replica(t, redistest.Start(t), 32)
			now := int64(1_800_000_000_000_000) // µs: the injected clock of both servers
			rng := rand.New(rand.NewPCG(uint64(len(a)), 25))
			p := Policy{Name: "one", Limit: 5, Window: 2 * time.Second, Algorithm: a}
			q := Policy{Name: "two", Limit: 3, Window: 3 * time.Second, Algorithm: a}
			if a.Bursty() {
				p.Burst, q.Burst = 7, 4
			}
			if a == ratelimit.LeakyBucket { // a queue decides one key at a time
				p.Queue, q.Queue = 4, 3
			}
			b := runner.(*Runner).batchers[a]
			ctx := context.Background()
			for n := 0; n < 3000; {
				size := 1 + rng.IntN(12)
				var batch []*pending
				var want []Reply
				for range size {
					checks := []Check{{Policy: p, Identity: fmt.Sprint("id", rng.IntN(40))}}
					switch {
					case a == ratelimit.LeakyBucket && rng.IntN(3) == 0:
						checks = []Check{{Policy: q, Identity: fmt.Sprint("other", rng.IntN(10))}}
					case a != ratelimit.LeakyBucket && rng.IntN(3) == 0:
						checks = append(checks, Check{Policy: q, Identity: fmt.Sprint("other", rng.IntN(10))})
					}
					m := member(alone, now, checks...)
					r, err := lone.Run(ctx, a, m.keys, m.c)
					if err != nil {
						t.Fatal(err)
					}
					want = append(want, r)
					batch = append(batch, member(batched, now, checks...))
					now += rng.Int64N(400_000)
					n++
				}
				b.send(batch)
				for i, pd := range batch {
					got := <-pd.done
					if got.err != nil {
						t.Fatalf("decision %d: %v", n-size+i, got.err)
					}
					if got.r.Allowed != want[i].Allowed || !slices.Equal(got.r.Pairs, want[i].Pairs) || got.r.Now != want[i].Now || got.r.Wait != want[i].Wait {
						t.Fatalf("decision %d, member %d of a batch of %d: batched %+v, alone %+v", n-size+i, i, size, got.r, want[i])
					}
				}
			}
		})
	}
}

// TestABatchReadsTheClockOnce: members of one batch that read the Redis clock decide at one
// instant, for every algorithm: five requests on a key of limit 3 (burst 3) share one `now` and
// are decided as five requests within a microsecond would be, three admitted and two refused;
// a member whose time is given keeps its own.
func TestABatchReadsTheClockOnce(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	for _, a := range ratelimit.Algorithms() {
		t.Run(string(a), func(t *testing.T) {
			t.Parallel()
			l, runner := replica(t, srv, 32)
			p := Policy{Name: "clock-" + string(a), Limit: 3, Window: time.Minute, Algorithm: a, Burst: 3}
			if !a.Bursty() {
				p.Burst = 0
			}
			if a == ratelimit.LeakyBucket {
				p.Queue = 2 // one served now, two waiting
			}
			k, given := Check{Policy: p, Identity: "k"}, Check{Policy: p, Identity: "given"}
			batch := []*pending{member(l, 0, k), member(l, 0, k), member(l, 0, k), member(l, 0, k), member(l, 0, k), member(l, 0, given)}
			at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC).UnixMicro()
			batch[5].c.Now = at
			runner.(*Runner).batchers[a].send(batch)
			var got []Reply
			for _, m := range batch {
				r := <-m.done
				if r.err != nil {
					t.Fatal(r.err)
				}
				got = append(got, r.r)
			}
			for i, r := range got[:5] {
				want := i < 3
				if r.Allowed != want || r.Now != got[0].Now || r.Pairs[0] != int64(max(0, 2-i)) {
					t.Errorf("member %d: allowed %v, remaining %d, now %d; want %v, %d, now %d (the batch's one clock)",
						i, r.Allowed, r.Pairs[0], r.Now, want, max(0, 2-i), got[0].Now)
				}
			}
			if got[5].Now != at || !got[5].Allowed {
				t.Errorf("the member with its own time: now %d, allowed %v; want %d, admitted", got[5].Now, got[5].Allowed, at)
			}
		})
	}
}

// TestBatchedReplicasAdmitExactlyTheLimit: three replicas, 48 goroutines, 4,000 decisions over
// 20 keys of limit 7: batches form (the test checks some had several members), and every key
// admits exactly its limit.
func TestBatchedReplicasAdmitExactlyTheLimit(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	var ls []*ratelimit.Limiter
	var batched atomic.Int64
	for range 3 {
		l, r := replica(t, srv, 32)
		ls = append(ls, l)
		for _, b := range r.(*Runner).batchers {
			b.sent = func(n int) {
				if n > 1 {
					batched.Add(1)
				}
			}
		}
	}
	p := Policy{Name: "pix", Limit: 7, Window: time.Minute}
	var mu sync.Mutex
	admitted := map[string]int{}
	var wg sync.WaitGroup
	for g := range 48 {
		wg.Go(func() {
			for i := range 4000 / 48 {
				id := fmt.Sprint("acct-", (g*31+i)%20)
				d, err := ls[g%3].AllowAll(context.Background(), Check{Policy: p, Identity: id})
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					mu.Lock()
					admitted[id]++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	for i := range 20 {
		if id := fmt.Sprint("acct-", i); admitted[id] != 7 {
			t.Errorf("%s admitted %d, want 7", id, admitted[id])
		}
	}
	if batched.Load() == 0 {
		t.Error("no batch had more than one member: the test proved nothing about batches")
	}
}

// TestADecisionThatWaitsPastItsBudgetIsNeverSent: with both calls in flight, a decision waits in
// the queue; when its budget runs out there it fails as unavailable at once, and the next flush
// skips it: nothing is recorded for a request answered by its fail mode.
func TestADecisionThatWaitsPastItsBudgetIsNeverSent(t *testing.T) {
	t.Parallel()
	l, r := replica(t, redistest.Start(t), 32)
	b := r.(*Runner).batchers[ratelimit.SlidingLog]
	var sent atomic.Int64
	b.sent = func(n int) { sent.Add(int64(n)) }
	b.mu.Lock()
	b.inFlight = maxInFlight // as if two calls were on their way
	b.mu.Unlock()
	p := Policy{Name: "pix", Limit: 5, Window: time.Minute}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := l.AllowAll(ctx, Check{Policy: p, Identity: "queued"})
	if !errors.Is(err, ratelimit.ErrUnavailable) || time.Since(start) > time.Second {
		t.Fatalf("a decision queued past its budget: %v after %v, want ErrUnavailable about then", err, time.Since(start))
	}
	b.mu.Lock()
	b.inFlight = maxInFlight - 1 // one call returns: its flush finds the queue
	b.mu.Unlock()
	b.flush()
	if n := sent.Load(); n != 0 {
		t.Errorf("%d decisions sent, want 0: the abandoned one must not be", n)
	}
	if d, err := l.AllowAll(context.Background(), Check{Policy: p, Identity: "queued"}); err != nil || !d.Allowed || d.Worst.Remaining != 4 {
		t.Errorf("the key after: %+v, want nothing recorded by the abandoned decision (4 left after this one)", d.Worst)
	}
}

// TestAShortMemberDoesNotCutItsBatch: a batch runs under its latest member's deadline, so a
// member near the end of its budget does not fail the others: with Redis stalled for 300 ms, a
// member with 100 ms left runs out (its late admission is then package withdraw's to take back),
// while a member with 5 s left is decided. A member whose budget ran out in the queue before the
// flush took it is not sent, and answered ErrNotSent.
func TestAShortMemberDoesNotCutItsBatch(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	l, r := replica(t, srv, 32)
	b := r.(*Runner).batchers[ratelimit.SlidingLog]
	p := Policy{Name: "pix", Limit: 5, Window: time.Minute}
	with := func(identity string, budget time.Duration) *pending {
		m := member(l, 0, Check{Policy: p, Identity: identity})
		ctx, cancel := context.WithTimeout(context.Background(), budget)
		t.Cleanup(cancel)
		m.ctx = ctx
		return m
	}
	expired, short, fresh := with("expired", -time.Millisecond), with("short", 100*time.Millisecond), with("fresh", 5*time.Second)
	srv.Pause() // Redis stalls for 300 ms
	resume := time.AfterFunc(300*time.Millisecond, srv.Resume)
	defer func() {
		if resume.Stop() {
			srv.Resume()
		}
	}()
	var sent atomic.Int64
	b.sent = func(n int) { sent.Add(int64(n)) }
	b.mu.Lock()
	b.queue = append(b.queue, expired, short, fresh)
	b.inFlight = 1 // the flush's own place
	b.mu.Unlock()
	go b.flush()
	if res := <-expired.done; !errors.Is(res.err, ratelimit.ErrNotSent) {
		t.Errorf("a member expired in the queue: %v, want ErrNotSent", res.err)
	}
	if res := <-fresh.done; res.err != nil {
		t.Fatalf("a member with 5 s of budget, batched beside one with 100 ms, Redis stalled 300 ms: %v, want decided", res.err)
	}
	if n := sent.Load(); n != 2 {
		t.Errorf("%d members sent, want 2: the expired one must not be", n)
	}
}

// TestABatchedDecisionEndsAtItsOwnDeadline: a decision whose batch is on its way when its budget
// runs out is answered unavailable then, not when the batch returns, which, under its latest
// member's deadline, may be much later: no decision waits past its budget. Here Redis stalls
// under a batch of a decision with a second of budget and one with 50 ms.
func TestABatchedDecisionEndsAtItsOwnDeadline(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	l, r := replica(t, srv, 32)
	b := r.(*Runner).batchers[ratelimit.SlidingLog]
	b.mu.Lock()
	b.inFlight = maxInFlight // both calls on their way: the decisions queue
	b.mu.Unlock()
	srv.Pause() // Redis stalls: the batch, once sent, waits
	defer srv.Resume()
	p := Policy{Name: "pix", Limit: 5, Window: time.Minute}
	long, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	go l.AllowAll(long, Check{Policy: p, Identity: "long"}) //nolint:errcheck // its answer is not this test's
	for b.waiting() < 1 {
		time.Sleep(time.Millisecond)
	}
	const budget = 50 * time.Millisecond
	short, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	go func() { // then a call returns, and its flush takes both
		for b.waiting() < 2 {
			time.Sleep(time.Millisecond)
		}
		b.mu.Lock()
		b.inFlight--
		b.startFlushLocked()
		b.mu.Unlock()
	}()
	meter := stalls.Watch(t) // a loaded machine's stalls are not the budget's
	start := time.Now()
	_, err := l.AllowAll(short, Check{Policy: p, Identity: "short"})
	if took := meter.Took(start); !errors.Is(err, ratelimit.ErrUnavailable) || errors.Is(err, ratelimit.ErrNotSent) || took > budget+100*time.Millisecond {
		t.Errorf("a batched decision, Redis stalled: %v after %v, want ErrUnavailable (sent, not ErrNotSent) about its %v budget", err, took, budget)
	}
}

// waiting is how many decisions wait in the queue (tests).
func (b *batcher) waiting() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.queue)
}

// panicking is a Runner whose calls panic.
type panicking struct{}

func (panicking) Run(context.Context, Algorithm, []string, ratelimit.Call) (Reply, error) {
	panic("a bug below the batcher")
}

// TestAPanicGivesItsPlaceBack: a lone call that panics (a bug below, turned into a 500 above)
// gives its place in flight back, so the decisions after it are still sent at once, never left
// waiting in the queue for a place no call will free.
func TestAPanicGivesItsPlaceBack(t *testing.T) {
	t.Parallel()
	b := New(nil, panicking{}, 32).(*Runner).batchers[ratelimit.SlidingLog]
	for range maxInFlight + 1 {
		func() {
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond) // queued, it would wait for ever
			defer cancel()
			defer func() { _ = recover() }()
			_, _ = b.decide(ctx, []string{"k"}, ratelimit.Call{})
		}()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.inFlight != 0 || len(b.queue) != 0 {
		t.Errorf("after %d panics: %d calls in flight, %d queued; want none", maxInFlight+1, b.inFlight, len(b.queue))
	}
}
