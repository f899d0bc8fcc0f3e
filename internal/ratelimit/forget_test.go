package ratelimit

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pixlimit/pixlimit/internal/testing/redistest"
)

// TestAskStepTakesNothing: for every algorithm, asking after two admissions of a limit of 3
// reports one left, and asking again and again changes nothing: the third request is still
// admitted and the fourth refused; a full key is asked as refused.
func TestAskStepTakesNothing(t *testing.T) {
	for _, a := range meters() {
		t.Run(string(a), func(t *testing.T) {
			t.Parallel()
			l, _, _ := newTestLimiter(t)
			withClock(l)
			p := Policy{Name: "ask", Limit: 3, Window: time.Minute, Algorithm: a}
			if a.Bursty() {
				p.Burst = 3
			}
			c := Check{p, "x"}
			mustAllow(t, l, c)
			mustAllow(t, l, c)
			for range 5 {
				d, err := lastOf(l.Decide(context.Background(), AskStep(c)))
				if err != nil || !d.Allowed || d.Worst.Remaining != 1 {
					t.Fatalf("asking after two of three: %+v, %v; want allowed with 1 left", d, err)
				}
			}
			if d := mustAllow(t, l, c); !d.Allowed {
				t.Fatal("the third request after five asks: refused")
			}
			if d, _ := lastOf(l.Decide(context.Background(), AskStep(c))); d.Allowed || d.Worst.Remaining != 0 || d.Worst.RetryAfter <= 0 {
				t.Fatalf("asking a full key: %+v, want refused with a RetryAfter", d.Worst)
			}
		})
	}
}

// TestForgetUnblocksEveryReplica: a key both replicas hold as full in their deny caches is
// forgotten on one: that one admits at once, and the other within about a heartbeat (it would
// otherwise keep refusing from memory for the key's whole minute), without asking Redis first.
func TestForgetUnblocksEveryReplica(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	var ls []*Limiter
	for range 2 {
		l, err := New(srv.Client(func(o *redis.Options) { ClientOptions(o, generous) }),
			Options{KeySecret: testSecret, Timeout: generous, FleetSize: 1, DenyCacheHold: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		ls = append(ls, l)
	}
	a, b := ls[0], ls[1]
	c := Check{policy("login-account", 1, time.Minute), "52998224725"}
	mustAllow(t, a, c)
	for _, l := range ls {
		if d := mustAllow(t, l, c); d.Allowed {
			t.Fatal("the second request was admitted")
		}
		if d := mustAllow(t, l, c); d.Allowed || !d.DenyCached {
			t.Fatalf("the third: %+v, want refused from the deny cache", d)
		}
	}
	if err := a.Forget(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	if d := mustAllow(t, a, c); !d.Allowed {
		t.Fatalf("on the replica that forgot: %+v, want admitted at once", d)
	}
	if err := a.Forget(context.Background(), c); err != nil { // for b's turn, the key is empty again
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		d := mustAllow(t, b, c)
		if d.Allowed {
			break
		}
		if !d.DenyCached {
			t.Fatalf("the other replica asked Redis and was refused: %+v", d)
		}
		if time.Now().After(deadline) {
			t.Fatal("the other replica still refuses from memory 5 s after the key was forgotten")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
