package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pixlimit/pixlimit/internal/testing/redistest"
)

// TestSequencesDecideAsOneByOne: a random trace of 2,000 sequences of one to four steps (every
// algorithm's decisions and asks over one or two keys, token-bucket charges and refunds, voucher
// grants and redemptions; 12 identities; time stepping by random amounts) is decided twice, on
// two Redis servers at the same injected times: as one Sequence, and step by step with the lone
// calls, stopping at the first refusal. Every step that ran is decided the same, key by key, and
// the same steps run: a sequence decides exactly as its steps sent one by one. Split, as on a
// cluster (each step its own call, a step's keys apart), the same steps run and each is admitted
// or refused the same; a refused split step's admissions are withdrawn after it, so its
// remainders are not compared.
func TestSequencesDecideAsOneByOne(t *testing.T) {
	t.Parallel()
	for _, split := range []bool{false, true} {
		t.Run(map[bool]string{false: "one call", true: "split"}[split], func(t *testing.T) {
			t.Parallel()
			sequencesDecideAsOneByOne(t, split)
		})
	}
}

func sequencesDecideAsOneByOne(t *testing.T, split bool) {
	// A budget of 5 s: a split step's refused keys are withdrawn after it, and a withdrawal of a
	// counter that Redis does not answer within the budget is given up (it may have run: trying
	// again could give back twice), leaving the split sequence stricter by one than the lone
	// calls (the test says so when it happens).
	seq, alone := replicas(t, redistest.Start(t), 1, 5*time.Second)[0], replicas(t, redistest.Start(t), 1, 5*time.Second)[0]
	seq.deny, alone.deny = nil, nil // Redis's decisions, not what a replica remembers of them
	seq.cluster = split
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
		o, cs := s.operation(), s.checks()
		switch _, voucher := s.(*voucherStep); {
		case voucher && o.kind == opGrant:
			return Decision{Allowed: true}, alone.Grant(ctx, cs[0])
		case voucher:
			ok, err := alone.Redeem(ctx, cs[0])
			return Decision{Allowed: ok}, err
		case o.kind == opAsk:
			return alone.AskAll(ctx, cs...)
		case o.kind == opRefund:
			return alone.Refund(ctx, o.n, cs...)
		case o.kind == opCharge:
			return alone.AllowN(ctx, cs[0], o.n)
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
		got, err := seq.Sequence(ctx, steps...)
		if err != nil {
			t.Fatalf("sequence %d: %v", i, err)
		}
		seq.withdrawals.Wait() // a split step's withdrawals land after it
		if lost := seq.Stats().WithdrawalsLost; lost > 0 {
			t.Fatalf("sequence %d: %d withdrawals lost (Redis did not answer one within the budget): the split sequence "+
				"is stricter from here on, by design, and no longer comparable", i, lost)
		}
		var want []Decision
		for _, s := range steps {
			d, err := lone(s)
			alone.withdrawals.Wait() // as for the sequence: a split call's withdrawals land after it
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
			if _, voucher := steps[j].(*voucherStep); voucher || split && !w.Allowed {
				continue // the lone calls say only whether; a split refusal is withdrawn after it
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

// lateReplies is a Redis client whose script calls, while lose is set, run but lose their
// replies, as a reply that comes back after the budget is lost to the caller.
type lateReplies struct {
	redis.Scripter
	lose atomic.Bool
}

func (c *lateReplies) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	cmd := c.Scripter.EvalSha(ctx, sha, keys, args...)
	if c.lose.Load() && cmd.Err() == nil {
		late := redis.NewCmd(ctx)
		late.SetErr(context.DeadlineExceeded)
		return late
	}
	return cmd
}

// TestALateSequenceLeavesNothing: a sequence that ran but whose reply was lost fails as
// unavailable; its sliding-log admission is then withdrawn by its id (as a late AllowAll's is),
// so the key holds only what was admitted before.
func TestALateSequenceLeavesNothing(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := &lateReplies{Scripter: srv.Client(func(o *redis.Options) { ClientOptions(o, generous) })}
	l, err := New(c, Options{KeySecret: testSecret, Timeout: generous})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	ctx := context.Background()
	bucket := Check{Policy{Name: "bucket", Limit: 2, Window: time.Minute, Algorithm: TokenBucket, Burst: 5}, "x"}
	log := Check{Policy{Name: "log", Limit: 3, Window: time.Minute}, "x"}
	if _, err := l.Sequence(ctx, AskStep(bucket), AllowStep(log)); err != nil { // loaded, and one admission
		t.Fatal(err)
	}
	c.lose.Store(true)
	_, err = l.Sequence(ctx, AskStep(bucket), AllowStep(log))
	c.lose.Store(false)
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("a sequence whose reply was lost: %v, want ErrUnavailable", err)
	}
	l.withdrawals.Wait()
	d, err := l.AskAll(ctx, log)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := 3-d.Worst.Remaining, 1; got != want {
		t.Errorf("the log holds %d admissions after the lost sequence, want %d: its admission was not withdrawn", got, want)
	}
}
