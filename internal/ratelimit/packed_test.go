package ratelimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pixlimit/pixlimit/internal/testing/clocktest"
	"github.com/pixlimit/pixlimit/internal/testing/redistest"
)

// sameLogTrace drives one random trace through a sorted-set log and a packed log (fleets of
// three replicas each over clients from newClient, injected time, several identities, one- and
// two-key decisions, limits lowered and raised along the way) and requires every decision and
// every Result, the values of every header, to be identical.
func sameLogTrace(t *testing.T, newClient func() redis.Scripter, seed uint64, steps int) {
	t.Helper()
	clk := clocktest.New()
	sorted, packed := world(t, newClient, fmt.Sprint("set", seed), 3, clk), world(t, newClient, fmt.Sprint("packed", seed), 3, clk)
	rng := rand.New(rand.NewPCG(seed, 99))
	refused := 0
	for step := range steps {
		clk.Wander(rng, 400*time.Millisecond, 15*time.Second)
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
		if !want.Allowed {
			refused++
		}
		if got.Allowed != want.Allowed || got.DenyCached != want.DenyCached || len(got.Results) != len(want.Results) {
			t.Fatalf("step %d %v: packed allowed=%v deny-cached=%v, sorted set %v %v", step, checks, got.Allowed, got.DenyCached, want.Allowed, want.DenyCached)
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

// TestPackedLogReadsOldTimesFromTheNewest: a key's times are completed from 32 bits, the newest
// to the time nearest now and the others to the one nearest it. A 28-minute window whose key
// holds an entry 40 minutes old (left by the write 13 minutes ago, when it was still inside the
// window) must read it as 40 minutes old, not as 31 minutes ahead (its 32 bits are nearer now
// from the future side), and decide as the sorted set does.
func TestPackedLogReadsOldTimesFromTheNewest(t *testing.T) {
	t.Parallel()
	l, _, _ := newTestLimiter(t)
	clk := withClock(l)
	for _, a := range []Algorithm{SlidingLog, SlidingLogPacked} {
		p := Policy{Name: "long", Limit: 5, Window: 28 * time.Minute, Algorithm: a}
		start := clk.Now()
		for _, at := range []time.Duration{0, 27 * time.Minute, 40 * time.Minute} {
			clk.Set(start.Add(at))
			d := mustAllow(t, l, Check{p, "ana"})
			if !d.Allowed {
				t.Fatalf("%s at +%v: refused", a, at)
			}
			if at == 40*time.Minute {
				// The entry at +0 has left; +27 and this one are inside.
				if got, want := d.Worst.Remaining, 3; got != want {
					t.Errorf("%s at +%v: Remaining %d, want %d", a, at, got, want)
				}
				if got, want := d.Worst.Reset, 15*time.Minute; got != want {
					t.Errorf("%s at +%v: Reset %v, want %v (when the +27 entry leaves)", a, at, got, want)
				}
			}
		}
		clk.Set(start)
	}
}

// TestPackedLogSetsItsTTLOnceAQuarter: the packed key lives a window past the end of its newest
// entry's quarter of a window, and an admission sets the TTL only when it starts a new quarter;
// a withdrawal of the newest entry sets it from the one before.
func TestPackedLogSetsItsTTLOnceAQuarter(t *testing.T) {
	t.Parallel()
	l, rdb, _ := newTestLimiter(t)
	clk := withClock(l)
	p := Policy{Name: "ttl", Limit: 10, Window: 20 * time.Second, Algorithm: SlidingLogPacked}
	key := l.keys.key(p, "ana")
	quarter := p.Window / 4
	q := quarter.Microseconds()
	s := time.UnixMicro(clk.Now().UnixMicro() / q * q) // a quarter's start: quarters count from the epoch
	ttl := func(what string, want time.Duration) {
		t.Helper()
		got, err := rdb.PTTL(context.Background(), key).Result()
		if err != nil {
			t.Fatal(err)
		}
		// Redis counts the TTL down on its own clock: allow the real time the test took (up to
		// 2s, still less than any of the differences checked here, 3s or more).
		if got > want || got < want-2*time.Second {
			t.Errorf("%s: TTL %v, want %v", what, got, want)
		}
	}
	admit := func(at time.Duration) int64 {
		t.Helper()
		clk.Set(s.Add(at))
		c := []Check{{p, "ana"}}
		call := NewCall(c...)
		call.Now = clk.Now().UnixMicro()
		r, err := Scripts(l.rdb).Run(context.Background(), SlidingLogPacked, []string{key}, call)
		if err != nil || !r.Allowed {
			t.Fatalf("admission at +%v: %v %v", at, r.Allowed, err)
		}
		return r.Now
	}
	first := admit(time.Second)
	ttl("a new key at +1s", 24*time.Second) // until +5s (its quarter's end), then a window
	second := admit(4 * time.Second)
	ttl("+4s, the same quarter: the TTL kept", 24*time.Second) // set again, it would be 21s
	third := admit(9 * time.Second)
	ttl("+9s, the next quarter: the TTL set again", 21*time.Second) // until +10s, then a window
	withdraw := func(at int64) {
		t.Helper()
		c := NewCall(Check{p, "ana"})
		n, err := Script(SlidingLogPacked).Run(context.Background(), l.rdb, []string{key}, c.Withdrawal(at, clk.Now().UnixMicro()).Args()...).Int64()
		if err != nil || n != 1 {
			t.Fatalf("withdrawal: %d %v", n, err)
		}
	}
	withdraw(third)
	ttl("+9s, the newest withdrawn: set from +4s's quarter", 16*time.Second) // until +25s, from +9s
	withdraw(second)
	withdraw(first)
	if n, err := rdb.Exists(context.Background(), key).Result(); err != nil || n != 0 {
		t.Errorf("every entry withdrawn: the key exists (%d, %v)", n, err)
	}
}
