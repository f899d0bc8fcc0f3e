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
			if a == LeakyBucket { // a queue decides one key at a time
				p.Queue, q.Queue = 4, 3
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
					switch {
					case a == LeakyBucket && rng.IntN(3) == 0:
						checks = []Check{{q, fmt.Sprint("other", rng.IntN(10))}}
					case a != LeakyBucket && rng.IntN(3) == 0:
						checks = append(checks, Check{q, fmt.Sprint("other", rng.IntN(10))})
					}
					keys := make([]string, len(checks))
					for i, c := range checks {
						keys[i] = alone.keys.key(c.Policy, c.Identity)
					}
					r, err := run(ctx, alone.rdb, a, keys, alone.newCall(a, op{kind: opDecide}, checks))
					if err != nil {
						t.Fatal(err)
					}
					want = append(want, r)
					batch = append(batch, &pending{ctx: ctx, keys: keys, c: batched.newCall(a, op{kind: opDecide}, checks), done: make(chan batchResult, 1)})
					clk.Add(time.Duration(rng.IntN(400)) * time.Millisecond)
					n++
				}
				b.send(batch)
				for i, pd := range batch {
					got := <-pd.done
					if got.err != nil {
						t.Fatalf("decision %d: %v", n-size+i, got.err)
					}
					if got.r.allowed != want[i].allowed || !slices.Equal(got.r.pairs, want[i].pairs) || got.r.now != want[i].now || got.r.wait != want[i].wait {
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
	for _, a := range Algorithms() {
		t.Run(string(a), func(t *testing.T) {
			t.Parallel()
			l := replicas(t, srv, 1, generous)[0]
			p := Policy{Name: "clock-" + string(a), Limit: 3, Window: time.Minute, Algorithm: a, Burst: 3}
			if !a.Bursty() {
				p.Burst = 0
			}
			if a == LeakyBucket {
				p.Queue = 2 // one served now, two waiting
			}
			member := func(identity string) *pending {
				checks := []Check{{p, identity}}
				return &pending{ctx: context.Background(), keys: []string{l.keys.key(p, identity)},
					c: l.newCall(a, op{kind: opDecide}, checks), done: make(chan batchResult, 1)}
			}
			batch := []*pending{member("k"), member("k"), member("k"), member("k"), member("k"), member("given")}
			given := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC).UnixMicro()
			batch[5].c.now = given
			l.batch[a].send(batch)
			var got []reply
			for _, m := range batch {
				r := <-m.done
				if r.err != nil {
					t.Fatal(r.err)
				}
				got = append(got, r.r)
			}
			for i, r := range got[:5] {
				want := i < 3
				if r.allowed != want || r.now != got[0].now || r.pairs[0] != int64(max(0, 2-i)) {
					t.Errorf("member %d: allowed %v, remaining %d, now %d; want %v, %d, now %d (the batch's one clock)",
						i, r.allowed, r.pairs[0], r.now, want, max(0, 2-i), got[0].now)
				}
			}
			if got[5].now != given || !got[5].allowed {
				t.Errorf("the member with its own time: now %d, allowed %v; want %d, admitted", got[5].now, got[5].allowed, given)
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
