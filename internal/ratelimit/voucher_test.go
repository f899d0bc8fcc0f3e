package ratelimit

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestVouchers: a grant is redeemed once; two grants twice; a grant older than the window not
// at all; and the key holds at most the policy's limit of them. Grants redeemed by 20 goroutines
// at once are taken exactly once each.
func TestVouchers(t *testing.T) {
	t.Parallel()
	l, _, _ := newTestLimiter(t)
	clk := withClock(l)
	ctx := context.Background()
	p := Policy{Name: "voucher", Limit: 3, Window: 10 * time.Minute}
	c := Check{p, "payer|key"}
	redeem := func() bool {
		t.Helper()
		ok, err := okOf(l.Decide(ctx, RedeemStep(c)))
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	grant := func(n int) {
		t.Helper()
		for range n {
			if err := errOf(l.Decide(ctx, GrantStep(c))); err != nil {
				t.Fatal(err)
			}
		}
	}
	if redeem() {
		t.Error("redeemed a voucher never granted")
	}
	grant(2)
	if !redeem() || !redeem() || redeem() {
		t.Error("two grants: want two redemptions, then none")
	}
	grant(1)
	clk.Add(10*time.Minute + time.Microsecond)
	if redeem() {
		t.Error("redeemed a grant older than the window")
	}
	grant(5)
	got := 0
	for redeem() {
		got++
	}
	if got != p.Limit {
		t.Errorf("5 grants held as %d, want the policy's limit, %d", got, p.Limit)
	}

	grant(3)
	var taken atomic.Int64
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			if ok, err := okOf(l.Decide(ctx, RedeemStep(c))); err == nil && ok {
				taken.Add(1)
			}
		})
	}
	wg.Wait()
	if n := taken.Load(); n != 3 {
		t.Errorf("20 concurrent redemptions of 3 grants took %d, want 3", n)
	}
}
