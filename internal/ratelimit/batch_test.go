package ratelimit

import (
	"context"
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
