package ratelimit

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pixlimit/pixlimit/internal/testing/redistest"
)

// TestSlotsHoldExactlyAcrossReplicas: 30 requests of one account at once over three replicas,
// two slots: exactly two hold one; a replay of one of them (its name) shares it; once both are
// given back, two more hold.
func TestSlotsHoldExactlyAcrossReplicas(t *testing.T) {
	srv := redistest.Start(t)
	ls := replicas(t, srv, 3, generous)
	p := Policy{Name: "inflight", Limit: 2, Window: 10 * time.Second}
	c := Check{p, "company"}
	var held sync.Map // holder by name
	var n atomic.Int64
	var wg sync.WaitGroup
	for i := range 30 {
		wg.Go(func() {
			name := fmt.Sprint("pix-", i)
			holder := Holder(name)
			d, err := lastOf(ls[i%3].Decide(context.Background(), HoldStep(c, holder)))
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
		replay := Holder(k.(string))
		if d, err := lastOf(ls[2].Decide(context.Background(), HoldStep(c, replay))); err != nil || !d.Allowed {
			t.Errorf("a replay of %s, in progress: %+v, %v; want it to share its original's slot", k, d, err)
		}
		replays = append(replays, replay)
		return true
	})
	if d, _ := lastOf(ls[0].Decide(context.Background(), HoldStep(c, Holder("another")))); d.Allowed || d.Worst.RetryAfter <= 0 {
		t.Errorf("a third request while two are in progress: %+v, want refused", d)
	}
	// A replay that ends first gives back its own hold, never its original's slot.
	for _, r := range replays {
		if err := errOf(ls[1].Decide(context.Background(), ReleaseStep(c, r))); err != nil {
			t.Error(err)
		}
	}
	if d, _ := lastOf(ls[0].Decide(context.Background(), HoldStep(c, Holder("another")))); d.Allowed {
		t.Errorf("the replays ended, the originals run: a third request was admitted")
	}
	held.Range(func(_, h any) bool {
		if err := errOf(ls[1].Decide(context.Background(), ReleaseStep(c, h.(string)))); err != nil {
			t.Error(err)
		}
		return true
	})
	for _, name := range []string{"a", "b"} {
		if d, _ := lastOf(ls[0].Decide(context.Background(), HoldStep(c, Holder(name)))); !d.Allowed {
			t.Errorf("after both were given back, %s was refused", name)
		}
	}
}

// TestASlotOfADeadReplicaFreesAtItsLease: a slot never given back (its replica died) is free
// again when its lease ends, and not before.
func TestASlotOfADeadReplicaFreesAtItsLease(t *testing.T) {
	l, _, _ := newTestLimiter(t)
	clk := withClock(l)
	p := Policy{Name: "lease", Limit: 1, Window: 10 * time.Second}
	c := Check{p, "company"}
	if d, _ := lastOf(l.Decide(context.Background(), HoldStep(c, Holder("dies")))); !d.Allowed {
		t.Fatal("the first request was refused")
	}
	clk.Add(10*time.Second - time.Millisecond)
	if d, _ := lastOf(l.Decide(context.Background(), HoldStep(c, Holder("next")))); d.Allowed {
		t.Fatal("admitted before the dead request's lease ended")
	}
	clk.Add(time.Millisecond)
	if d, _ := lastOf(l.Decide(context.Background(), HoldStep(c, Holder("next")))); !d.Allowed {
		t.Fatal("refused once the dead request's lease ended")
	}
}

// TestASlotIsAskedBeforeTheLimitAndTakenAfter: in one sequence, a full slot refuses before the
// limit records anything, and a refused limit takes no slot.
func TestASlotIsAskedBeforeTheLimitAndTakenAfter(t *testing.T) {
	l, _, _ := newTestLimiter(t)
	slots := Check{Policy{Name: "inflight", Limit: 1, Window: 10 * time.Second}, "co"}
	limit := Check{Policy{Name: "pix", Limit: 1, Window: time.Minute}, "co"}
	ctx := context.Background()
	holders := map[string]string{}
	pix := func(name string) Decisions {
		holders[name] = Holder(name)
		ds, err := l.Decide(ctx, AskHoldStep(slots, holders[name]), AllowStep(limit), HoldStep(slots, holders[name]))
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
	if d, _ := lastOf(l.Decide(ctx, AskStep(limit))); d.Worst.Remaining != 0 {
		t.Fatalf("the limit has %d left, want 0 (the first PIX only)", d.Worst.Remaining)
	}
	if _, err := l.Decide(ctx, ReleaseStep(slots, holders["one"])); err != nil {
		t.Fatal(err)
	}
	if ds := pix("three"); ds.Ran() != 2 || ds.Last().Allowed {
		t.Fatalf("a PIX over its limit: %d steps ran, want its limit refused", ds.Ran())
	}
	if d, _ := lastOf(l.Decide(ctx, HoldStep(slots, Holder("four")))); !d.Allowed {
		t.Error("a PIX refused by its limit kept a slot")
	}
}
