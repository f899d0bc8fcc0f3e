package sequence_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/pixlimit/pixlimit/internal/ratelimit"
	"github.com/pixlimit/pixlimit/internal/ratelimit/grants"
	"github.com/pixlimit/pixlimit/internal/ratelimit/sequence"
	"github.com/pixlimit/pixlimit/internal/testing/clocktest"
	"github.com/pixlimit/pixlimit/internal/testing/redistest"
	"github.com/redis/go-redis/v9"
)

// limiter is a Limiter on its own Redis at the clock's time, running several steps as one
// sequence when fused.
func limiter(t *testing.T, clk *clocktest.Clock, fused bool) *ratelimit.Limiter {
	t.Helper()
	// A budget of 5 s: a timeout is not what this tests.
	rdb := redistest.Start(t).Client(func(o *redis.Options) { ratelimit.ClientOptions(o, 5*time.Second) })
	o := ratelimit.Options{KeySecret: []byte("0123456789abcdef0123456789abcdef"), Timeout: 5 * time.Second, Now: clk.Now}
	if fused {
		o.Sequences = sequence.New(rdb)
	}
	l, err := ratelimit.New(rdb, o)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestSequencesDecideAsOneByOne: a random trace of 2,000 sequences of one to four steps (every
// algorithm's decisions and asks over one or two keys, token-bucket charges and refunds, voucher
// grants and redemptions; 12 identities; time stepping by random amounts) is decided twice, on
// two Redis servers at the same injected times: as one Decide, and step by step with the lone
// calls, stopping at the first refusal. Every step that ran is decided the same, key by key, and
// the same steps run: a sequence decides exactly as its steps sent one by one, in one call.
// Without a sequence runner (as on a cluster), the same again, in a call per step run. (On a
// real cluster a step's keys are decided apart too, by the Runner: package withdraw's tests hold
// that split to one script.)
func TestSequencesDecideAsOneByOne(t *testing.T) {
	t.Parallel()
	for _, fused := range []bool{true, false} {
		t.Run(map[bool]string{true: "one call", false: "apart"}[fused], func(t *testing.T) {
			t.Parallel()
			sequencesDecideAsOneByOne(t, fused)
		})
	}
}

// a traceStep is a step of the trace, and how to make it again for the lone calls.
type traceStep struct {
	step  ratelimit.Step
	again func() ratelimit.Step
}

func sequencesDecideAsOneByOne(t *testing.T, fused bool) {
	clk := clocktest.New()
	seq, alone := limiter(t, clk, fused), limiter(t, clk, false)
	rng := rand.New(rand.NewPCG(38, 2))
	ctx := context.Background()

	// The keys' TTLs run on Redis's real clock while the decisions run on the injected one: with
	// windows of seconds, a stall of a second or two on a busy machine between the two servers'
	// calls expired a key in one and not in the other ("remaining 2 … one by one 3"). Windows of
	// minutes, and steps of the injected clock as much longer, leave the trace as it was and no
	// TTL within reach of a stall.
	const scale = 30 * time.Second
	policies := map[ratelimit.Algorithm][2]ratelimit.Policy{}
	for _, a := range ratelimit.Algorithms() {
		p := ratelimit.Policy{Name: "one", Limit: 4, Window: 2 * scale, Algorithm: a}
		q := ratelimit.Policy{Name: "two", Limit: 3, Window: 3 * scale, Algorithm: a}
		if a.Bursty() {
			p.Burst, q.Burst = 6, 4
		}
		if a == ratelimit.LeakyBucket {
			p.Queue, q.Queue = 3, 2
		}
		policies[a] = [2]ratelimit.Policy{p, q}
	}
	vouchers := grants.Vouchers{Name: "voucher", Max: 3, Lifetime: 5 * scale}
	identity := func() string { return fmt.Sprint("id", rng.IntN(12)) }
	step := func() traceStep {
		if rng.IntN(6) == 0 {
			id := identity()
			if rng.IntN(2) == 0 {
				return traceStep{vouchers.Grant(id), func() ratelimit.Step { return vouchers.Grant(id) }}
			}
			return traceStep{vouchers.Redeem(id), func() ratelimit.Step { return vouchers.Redeem(id) }}
		}
		a := ratelimit.Algorithms()[rng.IntN(len(ratelimit.Algorithms()))]
		ps := policies[a]
		checks := []ratelimit.Check{{Policy: ps[0], Identity: identity()}}
		switch {
		case a == ratelimit.LeakyBucket && rng.IntN(3) == 0: // a queue decides one key at a time
			checks = []ratelimit.Check{{Policy: ps[1], Identity: identity()}}
		case a != ratelimit.LeakyBucket && rng.IntN(3) == 0:
			checks = append(checks, ratelimit.Check{Policy: ps[1], Identity: identity()})
		}
		var again func() ratelimit.Step
		switch r := rng.IntN(10); {
		case a == ratelimit.TokenBucket && r == 0:
			n := 1 + rng.IntN(5)
			again = func() ratelimit.Step { return ratelimit.ChargeStep(checks[0], n) }
		case a == ratelimit.TokenBucket && r == 1:
			n := 1 + rng.IntN(2)
			again = func() ratelimit.Step { return ratelimit.RefundStep(n, checks...) }
		case r < 3:
			again = func() ratelimit.Step { return ratelimit.AskStep(checks...) }
		default:
			again = func() ratelimit.Step { return ratelimit.AllowStep(checks...) }
		}
		return traceStep{again(), again}
	}

	ran := map[int]int{}
	for i := range 2000 {
		clk.Add(time.Duration(rng.IntN(400)) * scale / 1000)
		trace := make([]traceStep, 1+rng.IntN(4))
		steps := make([]ratelimit.Step, len(trace))
		for j := range trace {
			trace[j] = step()
			steps[j] = trace[j].step
		}
		before := seq.Stats().Redis
		got, err := seq.Decide(ctx, steps...)
		if err != nil {
			t.Fatalf("sequence %d: %v", i, err)
		}
		// One call for the whole sequence with a SequenceRunner; without one, a call per step run.
		if calls, want := seq.Stats().Redis-before, int64(got.Ran()); fused && len(steps) > 1 && calls != 1 || !fused && calls != want {
			t.Fatalf("sequence %d of %d steps (%d ran, fused %v): %d calls", i, len(steps), got.Ran(), fused, calls)
		}
		var want []ratelimit.Decision
		for _, s := range trace {
			ds, err := alone.Decide(ctx, s.again())
			if err != nil {
				t.Fatalf("sequence %d, one by one: %v", i, err)
			}
			want = append(want, ds.Last())
			if !ds.Last().Allowed {
				break
			}
		}
		if got.Ran() != len(want) {
			t.Fatalf("sequence %d of %d steps: %d ran, want %d (one by one)", i, len(steps), got.Ran(), len(want))
		}
		ran[got.Ran()]++
		for j := range want {
			g, _ := got.Of(steps[j])
			w := want[j]
			if g.Allowed != w.Allowed {
				t.Fatalf("sequence %d, step %d (%T): allowed %v, one by one %v", i, j+1, steps[j], g.Allowed, w.Allowed)
			}
			for k := range w.Results {
				if g.Results[k].Remaining != w.Results[k].Remaining || g.Results[k].Reset != w.Results[k].Reset {
					t.Fatalf("sequence %d, step %d, key %d: remaining %d reset %v, one by one %d %v", i, j+1, k+1,
						g.Results[k].Remaining, g.Results[k].Reset, w.Results[k].Remaining, w.Results[k].Reset)
				}
			}
		}
	}
	t.Logf("steps run per sequence: %v", ran)
	for n := 1; n <= 4; n++ {
		if ran[n] == 0 {
			t.Errorf("no sequence ran %d steps: the trace did not exercise it", n)
		}
	}
}
