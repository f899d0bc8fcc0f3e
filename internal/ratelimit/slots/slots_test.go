package slots_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pixlimit/pixlimit/internal/ratelimit"
	"github.com/pixlimit/pixlimit/internal/ratelimit/sequence"
	"github.com/pixlimit/pixlimit/internal/ratelimit/slots"
	"github.com/pixlimit/pixlimit/internal/testing/clocktest"
	"github.com/pixlimit/pixlimit/internal/testing/redistest"
	"github.com/redis/go-redis/v9"
)

// replicas are n Limiters on srv, each with its own client, at the clock's time when it is not
// nil, running several steps as one sequence (package sequence).
func replicas(t *testing.T, srv *redistest.Server, n int, clk *clocktest.Clock) []*ratelimit.Limiter {
	t.Helper()
	ls := make([]*ratelimit.Limiter, n)
	for i := range ls {
		rdb := srv.Client(func(o *redis.Options) { ratelimit.ClientOptions(o, time.Second) })
		o := ratelimit.Options{KeySecret: []byte("0123456789abcdef0123456789abcdef"), Timeout: time.Second, Sequences: sequence.New(rdb)}
		if clk != nil {
			o.Now = clk.Now
		}
		l, err := ratelimit.New(rdb, o)
		if err != nil {
			t.Fatal(err)
		}
		ls[i] = l
	}
	return ls
}

// lastOf is the last decision of a Decide.
func lastOf(ds ratelimit.Decisions, err error) (ratelimit.Decision, error) { return ds.Last(), err }

// TestSlotsHoldExactlyAcrossReplicas: 30 requests of one account at once over three replicas,
// two slots: exactly two hold one; a replay of one of them (its name) shares it; once both are
// given back, two more hold.
func TestSlotsHoldExactlyAcrossReplicas(t *testing.T) {
	ls := replicas(t, redistest.Start(t), 3, nil)
	s := slots.Slots{Name: "inflight", Count: 2, Lease: 10 * time.Second}
	var held sync.Map // holder by name
	var n atomic.Int64
	var wg sync.WaitGroup
	for i := range 30 {
		wg.Go(func() {
			name := fmt.Sprint("pix-", i)
			holder := slots.Holder(name)
			d, err := lastOf(ls[i%3].Decide(context.Background(), s.Hold("company", holder)))
			if err != nil {
				t.Error(err)
			}
			if d.Allowed {
				n.Add(1)
				held.Store(name, holder)
			}
		})
	}
	wg.Wait()
	if got := n.Load(); got != 2 {
		t.Fatalf("%d of 30 concurrent requests hold a slot, want exactly 2", got)
	}
	var replays []string
	held.Range(func(k, _ any) bool {
		replay := slots.Holder(k.(string))
		if d, err := lastOf(ls[2].Decide(context.Background(), s.Hold("company", replay))); err != nil || !d.Allowed {
			t.Errorf("a replay of %s, in progress: %+v, %v; want it to share its original's slot", k, d, err)
		}
		replays = append(replays, replay)
		return true
	})
	if d, _ := lastOf(ls[0].Decide(context.Background(), s.Hold("company", slots.Holder("another")))); d.Allowed || d.Worst.RetryAfter <= 0 {
		t.Errorf("a third request while two are in progress: %+v, want refused", d)
	}
	// A replay that ends first gives back its own hold, never its original's slot.
	for _, r := range replays {
		if _, err := ls[1].Decide(context.Background(), s.Release("company", r)); err != nil {
			t.Error(err)
		}
	}
	if d, _ := lastOf(ls[0].Decide(context.Background(), s.Hold("company", slots.Holder("another")))); d.Allowed {
		t.Errorf("the replays ended, the originals run: a third request was admitted")
	}
	held.Range(func(_, h any) bool {
		if _, err := ls[1].Decide(context.Background(), s.Release("company", h.(string))); err != nil {
			t.Error(err)
		}
		return true
	})
	for _, name := range []string{"a", "b"} {
		if d, _ := lastOf(ls[0].Decide(context.Background(), s.Hold("company", slots.Holder(name)))); !d.Allowed {
			t.Errorf("after both were given back, %s was refused", name)
		}
	}
}

// TestASlotOfADeadReplicaFreesAtItsLease: a slot never given back (its replica died) is free
// again when its lease ends, and not before.
func TestASlotOfADeadReplicaFreesAtItsLease(t *testing.T) {
	clk := clocktest.New()
	l := replicas(t, redistest.Start(t), 1, clk)[0]
	s := slots.Slots{Name: "lease", Count: 1, Lease: 10 * time.Second}
	if d, _ := lastOf(l.Decide(context.Background(), s.Hold("company", slots.Holder("dies")))); !d.Allowed {
		t.Fatal("the first request was refused")
	}
	clk.Add(10*time.Second - time.Millisecond)
	if d, _ := lastOf(l.Decide(context.Background(), s.Hold("company", slots.Holder("next")))); d.Allowed {
		t.Fatal("admitted before the dead request's lease ended")
	}
	clk.Add(time.Millisecond)
	if d, _ := lastOf(l.Decide(context.Background(), s.Hold("company", slots.Holder("next")))); !d.Allowed {
		t.Fatal("refused once the dead request's lease ended")
	}
}

// TestASlotIsAskedBeforeTheLimitAndTakenAfter: in one sequence, a full slot refuses before the
// limit records anything, and a refused limit takes no slot.
func TestASlotIsAskedBeforeTheLimitAndTakenAfter(t *testing.T) {
	l := replicas(t, redistest.Start(t), 1, nil)[0]
	s := slots.Slots{Name: "inflight", Count: 1, Lease: 10 * time.Second}
	limit := ratelimit.Check{Policy: ratelimit.Policy{Name: "pix", Limit: 1, Window: time.Minute}, Identity: "co"}
	ctx := context.Background()
	holders := map[string]string{}
	pix := func(name string) ratelimit.Decisions {
		holders[name] = slots.Holder(name)
		ds, err := l.Decide(ctx, s.Ask("co", holders[name]), ratelimit.AllowStep(limit), s.Hold("co", holders[name]))
		if err != nil {
			t.Fatal(err)
		}
		return ds
	}
	if ds := pix("one"); ds.Ran() != 3 || !ds.Last().Allowed {
		t.Fatalf("the first PIX: %d steps ran, want 3 admitted", ds.Ran())
	}
	if ds := pix("two"); ds.Ran() != 1 || ds.Last().Allowed {
		t.Fatalf("a second PIX while the first holds the slot: %d steps ran, want the ask refused alone", ds.Ran())
	}
	if d, _ := lastOf(l.Decide(ctx, ratelimit.AskStep(limit))); d.Worst.Remaining != 0 {
		t.Fatalf("the limit has %d left, want 0 (the first PIX only)", d.Worst.Remaining)
	}
	if _, err := l.Decide(ctx, s.Release("co", holders["one"])); err != nil {
		t.Fatal(err)
	}
	if ds := pix("three"); ds.Ran() != 2 || ds.Last().Allowed {
		t.Fatalf("a PIX over its limit: %d steps ran, want its limit refused", ds.Ran())
	}
	if d, _ := lastOf(l.Decide(ctx, s.Hold("co", slots.Holder("four")))); !d.Allowed {
		t.Error("a PIX refused by its limit kept a slot")
	}
}

// slotsModel is the slots in Go, as slots.lua decides them: each holder's lease end; a holder's
// slot is its name, what comes before its last ':'.
type slotsModel struct {
	s      slots.Slots
	leases map[string]time.Time
}

// decide holds (take), asks or releases holder's slot at now, and returns the verdict, the free
// slots after it and the time until the first lease ends.
func (m slotsModel) decide(now time.Time, holder, op string) (allowed bool, remaining int, reset time.Duration) {
	name := func(h string) string { return h[:strings.LastIndex(h, ":")] }
	for h, end := range m.leases {
		if !end.After(now) { // a lease ended: its replica stopped answering
			delete(m.leases, h)
		}
	}
	names := func() map[string]bool {
		in := map[string]bool{}
		for h := range m.leases {
			in[name(h)] = true
		}
		return in
	}
	allowed = true
	switch op {
	case "release":
		delete(m.leases, holder)
	default:
		in := names()
		allowed = in[name(holder)] || len(in) < m.s.Count
		if allowed && op == "hold" {
			m.leases[holder] = now.Add(m.s.Lease)
		}
	}
	for _, end := range m.leases {
		if d := end.Sub(now); reset == 0 || d < reset {
			reset = d
		}
	}
	return allowed, max(0, m.s.Count-len(names())), reset
}

// TestSlotsFollowTheirModel: thousands of random holds, asks and releases by a few holders of a
// few names, the clock stepping past leases, decided by slots.lua, alone and as a PIX's sequence
// runs it (ask, then hold), and by slotsModel: every verdict, count of free slots and time to
// the first lease's end agree.
func TestSlotsFollowTheirModel(t *testing.T) {
	clk := clocktest.New()
	l := replicas(t, redistest.Start(t), 1, clk)[0]
	s := slots.Slots{Name: "model", Count: 2, Lease: 3 * time.Second}
	m := slotsModel{s: s, leases: map[string]time.Time{}}
	rng := rand.New(rand.NewPCG(46, 47))
	ctx := context.Background()
	refused := 0
	check := func(step int, what string, got ratelimit.Decision, holder, op string) {
		t.Helper()
		allowed, remaining, reset := m.decide(clk.Now(), holder, op)
		if !allowed {
			refused++
		}
		if got.Allowed != allowed || got.Worst.Remaining != remaining || got.Worst.Reset != reset {
			t.Fatalf("step %d, %s %s: script allowed %v, %d free, reset %v; model %v, %d, %v",
				step, what, holder, got.Allowed, got.Worst.Remaining, got.Worst.Reset, allowed, remaining, reset)
		}
	}
	for i := range 3000 {
		if rng.IntN(10) == 0 {
			clk.Add(s.Lease) // a lease held since the last step ends exactly now
		} else {
			clk.Wander(rng, 200*time.Millisecond, 4*time.Second)
		}
		holder := fmt.Sprintf("n%d:h%d", rng.IntN(4), rng.IntN(3))
		switch op := []string{"hold", "ask", "release", "pix"}[rng.IntN(4)]; op {
		case "pix": // ask, then hold, in one call: the hold runs only if the ask was admitted
			ask, hold := s.Ask("co", holder), s.Hold("co", holder)
			ds, err := l.Decide(ctx, ask, hold)
			if err != nil {
				t.Fatal(err)
			}
			asked, _ := ds.Of(ask)
			check(i, "pix ask", asked, holder, "ask")
			if held, ran := ds.Of(hold); ran != asked.Allowed {
				t.Fatalf("step %d: the ask admitted %v, the hold ran %v", i, asked.Allowed, ran)
			} else if ran {
				check(i, "pix hold", held, holder, "hold")
			}
		default:
			step := map[string]func(string, string) ratelimit.Step{"hold": s.Hold, "ask": s.Ask, "release": s.Release}[op]
			d, err := lastOf(l.Decide(ctx, step("co", holder)))
			if err != nil {
				t.Fatal(err)
			}
			check(i, op, d, holder, op)
		}
	}
	if refused < 100 {
		t.Fatalf("%d refusals in 3000 steps: the trace hardly tried the slots' limit", refused)
	}
}

// unanswered is a Decider that Redis does not answer until its first `fails` calls have failed;
// each call is counted on calls.
type unanswered struct {
	fails int32
	n     atomic.Int32
	calls chan int32
}

func (u *unanswered) AllowAll(context.Context, ...ratelimit.Check) (ratelimit.Decision, error) {
	return ratelimit.Decision{}, ratelimit.ErrUnavailable
}

func (u *unanswered) Decide(_ context.Context, steps ...ratelimit.Step) (ratelimit.Decisions, error) {
	n := u.n.Add(1)
	u.calls <- n
	if n <= u.fails {
		return ratelimit.Decisions{}, ratelimit.ErrUnavailable
	}
	return ratelimit.DecisionsOf(steps, make([]ratelimit.Decision, len(steps))...), nil
}

// TestRetrySendsAReleaseUntilRedisAnswers: a release Redis did not answer is sent again until it
// is answered, then no more; past its bound a Retry takes none, and once closed none either,
// its retries stopped.
func TestRetrySendsAReleaseUntilRedisAnswers(t *testing.T) {
	s := slots.Slots{Name: "pix-concurrency", Count: 2, Lease: time.Hour}
	u := &unanswered{fails: 2, calls: make(chan int32, 16)}
	r := slots.NewRetry(u, 1)
	if !r.Release(s.Release("acct-ana", "k1:1")) {
		t.Fatal("Release: not taken, with room for one")
	}
	if r.Release(s.Release("acct-ana", "k2:1")) {
		t.Error("a second Release past a bound of 1: taken")
	}
	for want := int32(1); want <= 3; want++ {
		select {
		case got := <-u.calls:
			if got != want {
				t.Fatalf("call %d, want %d", got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no attempt %d within 10s", want)
		}
	}
	r.Close() // the third attempt was answered: its goroutine ends, and Close waits for it
	if n := u.n.Load(); n != 3 {
		t.Errorf("%d attempts, want 3: two unanswered, then the one answered", n)
	}
	if r.Release(s.Release("acct-ana", "k3:1")) {
		t.Error("Release after Close: taken")
	}

	stuck := &unanswered{fails: 1 << 30, calls: make(chan int32, 1<<10)}
	r = slots.NewRetry(stuck, 4)
	r.Release(s.Release("acct-bruno", "k1:1"))
	<-stuck.calls
	r.Close() // returns: the retry stops at Close, not at its lease (an hour)
}
