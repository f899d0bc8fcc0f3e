package ratelimit

import (
	"context"
	"testing"
	"time"
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
