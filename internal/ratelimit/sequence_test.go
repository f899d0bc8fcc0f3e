package ratelimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/pixlimit/pixlimit/internal/testing/redistest"
)

// TestSequencesDecideAsOneByOne: a random trace of 2,000 sequences of one to four steps (every
// algorithm's decisions and asks over one or two keys, token-bucket charges and refunds, voucher
// grants and redemptions; 12 identities; time stepping by random amounts) is decided twice, on
// two Redis servers at the same injected times: as one Sequence, and step by step with the lone
// calls, stopping at the first refusal. Every step that ran is decided the same, key by key, and
// the same steps run: a sequence decides exactly as its steps sent one by one.
func TestSequencesDecideAsOneByOne(t *testing.T) {
	t.Parallel()
	seq, alone := replicas(t, redistest.Start(t), 1, generous)[0], replicas(t, redistest.Start(t), 1, generous)[0]
	seq.deny, alone.deny = nil, nil // Redis's decisions, not what a replica remembers of them
	clk := withClock(seq)
	alone.now = clk.Now
	rng := rand.New(rand.NewPCG(38, 2))
	ctx := context.Background()

	policies := map[Algorithm][2]Policy{}
	for _, a := range Algorithms() {
		p := Policy{Name: "one", Limit: 4, Window: 2 * time.Second, Algorithm: a}
		q := Policy{Name: "two", Limit: 3, Window: 3 * time.Second, Algorithm: a}
		if a.Bursty() {
			p.Burst, q.Burst = 6, 4
		}
		policies[a] = [2]Policy{p, q}
	}
	voucher := Policy{Name: "voucher", Limit: 3, Window: 5 * time.Second}
	identity := func() string { return fmt.Sprint("id", rng.IntN(12)) }
	step := func() Step {
		if rng.IntN(6) == 0 {
			c := Check{voucher, identity()}
			if rng.IntN(2) == 0 {
				return GrantStep(c)
			}
			return RedeemStep(c)
		}
		a := Algorithms()[rng.IntN(len(Algorithms()))]
		ps := policies[a]
		checks := []Check{{ps[0], identity()}}
		if rng.IntN(3) == 0 {
			checks = append(checks, Check{ps[1], identity()})
		}
		switch r := rng.IntN(10); {
		case a == TokenBucket && r == 0:
			return ChargeStep(checks[0], 1+rng.IntN(5))
		case a == TokenBucket && r == 1:
			return RefundStep(1+rng.IntN(2), checks...)
		case r < 3:
			return AskStep(checks...)
		}
		return AllowStep(checks...)
	}
	lone := func(s Step) (Decision, error) {
		switch {
		case s.voucher && s.op.kind == opGrant:
			return Decision{Allowed: true}, alone.Grant(ctx, s.checks[0])
		case s.voucher:
			ok, err := alone.Redeem(ctx, s.checks[0])
			return Decision{Allowed: ok}, err
		case s.op.kind == opAsk:
			return alone.AskAll(ctx, s.checks...)
		case s.op.kind == opRefund:
			return alone.Refund(ctx, s.op.n, s.checks...)
		case s.op.kind == opCharge:
			return alone.AllowN(ctx, s.checks[0], s.op.n)
		}
		return alone.AllowAll(ctx, s.checks...)
	}

	ran := map[int]int{}
	for i := range 2000 {
		clk.Add(time.Duration(rng.IntN(400)) * time.Millisecond)
		steps := make([]Step, 1+rng.IntN(4))
		for j := range steps {
			steps[j] = step()
		}
		got, err := seq.Sequence(ctx, steps...)
		if err != nil {
			t.Fatalf("sequence %d: %v", i, err)
		}
		var want []Decision
		for _, s := range steps {
			d, err := lone(s)
			if err != nil {
				t.Fatalf("sequence %d, one by one: %v", i, err)
			}
			want = append(want, d)
			if !d.Allowed {
				break
			}
		}
		if len(got) != len(want) {
			t.Fatalf("sequence %d of %d steps: %d ran, want %d (one by one)", i, len(steps), len(got), len(want))
		}
		ran[len(got)]++
		for j := range want {
			g, w := got[j], want[j]
			if g.Allowed != w.Allowed {
				t.Fatalf("sequence %d, step %d (%+v): allowed %v, one by one %v", i, j+1, steps[j].op, g.Allowed, w.Allowed)
			}
			if steps[j].voucher {
				continue // the lone calls say only whether
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
