package ratelimit

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

	"github.com/pixlimit/pixlimit/internal/testing/redistest"
)

// TestBatchesDecideAsOneByOne: for every algorithm, a random trace of 3,000 decisions (40
// identities, one- and two-key decisions, time stepping by random amounts) is decided twice, on
// two Redis servers at the same injected times: one by one with the algorithm's script, and in
// random batches of 1 to 12 with its batch script. Every decision's reply is the same, member by
// member: a batch decides exactly as its members sent one by one in that order.
func TestBatchesDecideAsOneByOne(t *testing.T) {
	t.Parallel()
	for _, a := range Algorithms() {
		t.Run(string(a), func(t *testing.T) {
			t.Parallel()
			alone, batched := replicas(t, redistest.Start(t), 1, generous)[0], replicas(t, redistest.Start(t), 1, generous)[0]
			clk := withClock(alone)
			batched.now = clk.Now
			rng := rand.New(rand.NewPCG(uint64(len(a)), 25))
			p := Policy{Name: "one", Limit: 5, Window: 2 * time.Second, Algorithm: a}
			q := Policy{Name: "two", Limit: 3, Window: 3 * time.Second, Algorithm: a}
			if a.Bursty() {
				p.Burst, q.Burst = 7, 4
			}
			b := batched.batch[a]
			if b == nil {
				t.Fatal("no batcher: batching is off by default")
			}
			ctx := context.Background()
			for n := 0; n < 3000; {
				size := 1 + rng.IntN(12)
				var batch []*pending
				var want []reply
				for range size {
					checks := []Check{{p, fmt.Sprint("id", rng.IntN(40))}}
					if rng.IntN(3) == 0 {
						checks = append(checks, Check{q, fmt.Sprint("other", rng.IntN(10))})
					}
					keys := make([]string, len(checks))
					for i, c := range checks {
						keys[i] = alone.keys.key(c.Policy, c.Identity)
					}
					r, err := run(ctx, alone.rdb, a, keys, alone.newCall(a, decideMode(1), checks))
					if err != nil {
						t.Fatal(err)
					}
					want = append(want, r)
					batch = append(batch, &pending{ctx: ctx, keys: keys, c: batched.newCall(a, decideMode(1), checks), done: make(chan batchResult, 1)})
					clk.Add(time.Duration(rng.IntN(400)) * time.Millisecond)
					n++
				}
				b.send(batch)
				for i, pd := range batch {
					got := <-pd.done
					if got.err != nil {
						t.Fatalf("decision %d: %v", n-size+i, got.err)
					}
					if got.r.allowed != want[i].allowed || !slices.Equal(got.r.pairs, want[i].pairs) || got.r.now != want[i].now {
						t.Fatalf("decision %d, member %d of a batch of %d: batched %+v, alone %+v", n-size+i, i, size, got.r, want[i])
					}
				}
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
	ls := replicas(t, srv, 3, generous)
	var batched atomic.Int64
	for _, l := range ls {
		for _, b := range l.batch {
			b.sent = func(n int) {
				if n > 1 {
					batched.Add(1)
				}
			}
		}
	}
	p := policy("pix", 7, time.Minute)
	var mu sync.Mutex
	admitted := map[string]int{}
	var wg sync.WaitGroup
	for g := range 48 {
		wg.Go(func() {
			for i := range 4000 / 48 {
				id := fmt.Sprint("acct-", (g*31+i)%20)
				d, err := ls[g%3].AllowAll(context.Background(), Check{p, id})
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
	l := replicas(t, redistest.Start(t), 1, generous)[0]
	b := l.batch[SlidingLog]
	var sent atomic.Int64
	b.sent = func(n int) { sent.Add(int64(n)) }
	b.mu.Lock()
	b.inFlight = maxInFlight // as if two calls were on their way
	b.mu.Unlock()
	p := policy("pix", 5, time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := l.AllowAll(ctx, Check{p, "queued"})
	if !errors.Is(err, ErrUnavailable) || time.Since(start) > time.Second {
		t.Fatalf("a decision queued past its budget: %v after %v, want ErrUnavailable about then", err, time.Since(start))
	}
	b.mu.Lock()
	b.inFlight = maxInFlight - 1 // one call returns: its flush finds the queue
	b.mu.Unlock()
	b.flush()
	if n := sent.Load(); n != 0 {
		t.Errorf("%d decisions sent, want 0: the abandoned one must not be", n)
	}
	if d := mustAllow(t, l, Check{p, "queued"}); !d.Allowed || d.Worst.Remaining != 4 {
		t.Errorf("the key after: %+v, want nothing recorded by the abandoned decision (4 left after this one)", d.Worst)
	}
}

// TestAllowLocalDecidesAtItsShare: with a fleet of 3, a limit of 10 is 4 per window in each
// replica's memory, as an exact sliding log: 4 admitted, the 5th refused until exactly when the
// oldest leaves the window; two keys are decided together; the log forgets everything once
// Redis answers again; and its memory is bounded by LocalLogSize.
func TestAllowLocalDecidesAtItsShare(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := srv.Client(nil)
	l, err := New(c, Options{KeySecret: testSecret, Timeout: generous, LocalLogSize: 100})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	l.fleet.Store(3)
	clk := withClock(l)
	p := policy("statement", 10, time.Minute)
	for i := range 4 {
		if d := l.AllowLocal(Check{p, "ana"}); !d.Allowed || !d.Fallback || d.Worst.Capacity != 4 || d.Worst.Remaining != 3-i {
			t.Fatalf("local %d: %+v, want admitted, 4 of the share, %d left", i+1, d, 3-i)
		}
		clk.Add(time.Second)
	}
	d := l.AllowLocal(Check{p, "ana"})
	if d.Allowed || d.Worst.RetryAfter != 56*time.Second || d.Worst.Policy.Limit != 4 {
		t.Fatalf("the 5th: %+v, want refused until the oldest leaves: 56s", d.Worst)
	}
	clk.Add(56*time.Second - time.Microsecond)
	if l.AllowLocal(Check{p, "ana"}).Allowed {
		t.Fatal("admitted before Retry-After")
	}
	clk.Add(time.Microsecond)
	if !l.AllowLocal(Check{p, "ana"}).Allowed {
		t.Fatal("refused at Retry-After")
	}
	ip, doc := policy("login-ip", 10, time.Minute), policy("login-account", 5, time.Minute) // shares 4 and 2
	for range 2 {
		l.AllowLocal(Check{ip, "1.2.3.4"}, Check{doc, "cpf"})
	}
	if d := l.AllowLocal(Check{ip, "1.2.3.4"}, Check{doc, "cpf"}); d.Allowed || d.Results[0].Remaining != 2 {
		t.Errorf("two keys, the document's share (2) used: %+v, want refused, the IP key untouched at 2 left", d)
	}
	for i := range 500 {
		l.AllowLocal(Check{p, fmt.Sprint("flood-", i)})
	}
	if n := l.local.size(); n > 100 {
		t.Errorf("%d keys in the local log, want at most LocalLogSize (100)", n)
	}
	l.down.Store(true) // as after a failed decision
	mustAllow(t, l, Check{p, "ana"})
	if n := l.local.size(); n != 0 {
		t.Errorf("%d keys in the local log after Redis answered, want none", n)
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
		for l.FleetSize() != 3 && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if got := l.FleetSize(); got != 3 {
			t.Errorf("fleet size %d after %v, want 3", got, 5*heartbeatEvery)
		}
	}
}
