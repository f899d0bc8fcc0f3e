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
// two Redis servers at the same injected times: as one Decide, and step by step with the lone
// calls, stopping at the first refusal. Every step that ran is decided the same, key by key, and
// the same steps run: a sequence decides exactly as its steps sent one by one. Apart, as on a
// cluster (each step its own call), the same again. (On a real cluster a step's keys are decided
// apart too, by the Runner: package withdraw's tests hold that split to one script.)
func TestSequencesDecideAsOneByOne(t *testing.T) {
	t.Parallel()
	for _, apart := range []bool{false, true} {
		t.Run(map[bool]string{false: "one call", true: "apart"}[apart], func(t *testing.T) {
			t.Parallel()
			sequencesDecideAsOneByOne(t, apart)
		})
	}
}

func sequencesDecideAsOneByOne(t *testing.T, apart bool) {
	// A budget of 5 s: a timeout is not what this tests.
	seq, alone := replicas(t, redistest.Start(t), 1, 5*time.Second)[0], replicas(t, redistest.Start(t), 1, 5*time.Second)[0]
	seq.cluster = apart // each step its own call; on one node a step's keys stay in one script
	clk := withClock(seq)
	alone.now = clk.Now
	rng := rand.New(rand.NewPCG(38, 2))
	ctx := context.Background()

	// The keys' TTLs run on Redis's real clock while the decisions run on the injected one: with
	// windows of seconds, a stall of a second or two on a busy machine between the two servers'
	// calls expired a key in one and not in the other ("remaining 2 … one by one 3"). Windows of
	// minutes, and steps of the injected clock as much longer, leave the trace as it was and no
	// TTL within reach of a stall.
	const scale = 30 * time.Second
	policies := map[Algorithm][2]Policy{}
	for _, a := range Algorithms() {
		p := Policy{Name: "one", Limit: 4, Window: 2 * scale, Algorithm: a}
		q := Policy{Name: "two", Limit: 3, Window: 3 * scale, Algorithm: a}
		if a.Bursty() {
			p.Burst, q.Burst = 6, 4
		}
		if a == LeakyBucket {
			p.Queue, q.Queue = 3, 2
		}
		policies[a] = [2]Policy{p, q}
	}
	voucher := Policy{Name: "voucher", Limit: 3, Window: 5 * scale}
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
		switch {
		case a == LeakyBucket && rng.IntN(3) == 0: // a queue decides one key at a time
			checks = []Check{{ps[1], identity()}}
		case a != LeakyBucket && rng.IntN(3) == 0:
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
		o, cs := s.operation(), s.Checks()
		switch _, voucher := s.(*voucherStep); {
		case voucher && o.kind == opGrant:
			return Decision{Allowed: true}, errOf(alone.Decide(ctx, GrantStep(cs[0])))
		case voucher:
			ok, err := okOf(alone.Decide(ctx, RedeemStep(cs[0])))
			return Decision{Allowed: ok}, err
		case o.kind == opAsk:
			return lastOf(alone.Decide(ctx, AskStep(cs...)))
		case o.kind == opRefund:
			return lastOf(alone.Decide(ctx, RefundStep(o.n, cs...)))
		case o.kind == opCharge:
			return lastOf(alone.Decide(ctx, ChargeStep(cs[0], o.n)))
		}
		return alone.AllowAll(ctx, cs...)
	}

	ran := map[int]int{}
	for i := range 2000 {
		clk.Add(time.Duration(rng.IntN(400)) * scale / 1000)
		steps := make([]Step, 1+rng.IntN(4))
		for j := range steps {
			steps[j] = step()
		}
		got, err := seq.Decide(ctx, steps...)
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
		if got.Ran() != len(want) {
			t.Fatalf("sequence %d of %d steps: %d ran, want %d (one by one)", i, len(steps), got.Ran(), len(want))
		}
		ran[got.Ran()]++
		for j := range want {
			g, _ := got.Of(steps[j])
			w := want[j]
			if g.Allowed != w.Allowed {
				t.Fatalf("sequence %d, step %d (%+v): allowed %v, one by one %v", i, j+1, steps[j].operation(), g.Allowed, w.Allowed)
			}
			if _, voucher := steps[j].(*voucherStep); voucher {
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
