package ratelimit

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pixlimit/pixlimit/internal/testing/redistest"
)

// sameLogTrace drives one random trace through a sorted-set log and a packed log (fleets of
// three replicas each over clients from newClient, injected time, several identities, one- and
// two-key decisions, limits lowered and raised along the way) and requires every decision and
// every Result, the values of every header, to be identical.
func sameLogTrace(t *testing.T, newClient func() redis.Scripter, seed uint64, steps int) {
	t.Helper()
	clk := &clock{now: time.UnixMicro(1_800_000_000_000_000)}
	sorted, packed := world(t, newClient, fmt.Sprint("set", seed), 3, 0, clk), world(t, newClient, fmt.Sprint("packed", seed), 3, 0, clk)
	rng := rand.New(rand.NewPCG(seed, 99))
	refused := 0
	for step := range steps {
		randomStep(clk, rng, 400*time.Millisecond, 15*time.Second)
		limitA := 3 + step/(steps/3) // 3, 4, 5: a limit raised while keys hold entries
		if step > steps*5/6 {
			limitA = 2 // and lowered below what they hold
		}
		pa := Policy{Name: "a", Limit: limitA, Window: 10 * time.Second}
		pb := Policy{Name: "b", Limit: 4, Window: 3 * time.Second}
		x, y := fmt.Sprint(rng.IntN(3)), fmt.Sprint(rng.IntN(3))
		checks := [][]Check{{{pa, x}}, {{pb, y}}, {{pa, x}, {pb, y}}}[rng.IntN(3)]
		r := rng.IntN(3)
		want := mustAllow(t, sorted[r], checks...)
		for i := range checks {
			checks[i].Policy.Algorithm = SlidingLogPacked
		}
		got := mustAllow(t, packed[r], checks...)
		for _, l := range append(sorted, packed...) {
			l.withdrawals.Wait() // a cluster's split refusals are withdrawn in the background: let both land
		}
		if !want.Allowed {
			refused++
		}
		if got.Allowed != want.Allowed || got.Local != want.Local || len(got.Results) != len(want.Results) {
			t.Fatalf("step %d %v: packed allowed=%v local=%v, sorted set %v %v", step, checks, got.Allowed, got.Local, want.Allowed, want.Local)
		}
		for i := range want.Results {
			g, w := got.Results[i], want.Results[i]
			g.Policy.Algorithm = w.Policy.Algorithm
			if g != w {
				t.Fatalf("step %d key %d: packed %+v, sorted set %+v", step, i, g, w)
			}
		}
	}
	if refused < steps/5 {
		t.Errorf("%d of %d refused: the trace did not fill the logs", refused, steps)
	}
}

// TestPackedLogDecidesAsTheSortedSet: the same random traces through both logs on one Redis.
func TestPackedLogDecidesAsTheSortedSet(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	for seed := range uint64(3) {
		sameLogTrace(t, client(srv), seed, 2000)
	}
}

// TestPackedLogDecidesAsTheSortedSetOnACluster: the same on a Redis Cluster, where the two-key
// decisions are split per slot and withdrawn.
func TestPackedLogDecidesAsTheSortedSetOnACluster(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t, 3, 0)
	sameLogTrace(t, func() redis.Scripter {
		opt := &redis.UniversalOptions{Addrs: c.Addrs(), IsClusterMode: true}
		UniversalClientOptions(opt, generous)
		rc := redis.NewUniversalClient(opt)
		t.Cleanup(func() { _ = rc.Close() })
		return rc
	}, 7, 1000)
}
