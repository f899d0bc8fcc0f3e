package grants_test

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pixlimit/pixlimit/internal/ratelimit"
	"github.com/pixlimit/pixlimit/internal/ratelimit/grants"
	"github.com/pixlimit/pixlimit/internal/testing/clocktest"
	"github.com/pixlimit/pixlimit/internal/testing/redistest"
	"github.com/redis/go-redis/v9"
)

// limiter is a Limiter on a Redis of its own, at the clock's time.
func limiter(t *testing.T, clk *clocktest.Clock) *ratelimit.Limiter {
	t.Helper()
	rdb := redistest.Start(t).Client(func(o *redis.Options) { ratelimit.ClientOptions(o, time.Second) })
	l, err := ratelimit.New(rdb, ratelimit.Options{KeySecret: []byte("0123456789abcdef0123456789abcdef"), Timeout: time.Second, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestVouchers: a grant is redeemed once; two grants twice; a grant older than the window not
// at all; and the key holds at most Max of them. Grants redeemed by 20 goroutines
// at once are taken exactly once each.
func TestVouchers(t *testing.T) {
	t.Parallel()
	clk := clocktest.New()
	l := limiter(t, clk)
	ctx := context.Background()
	v := grants.Vouchers{Name: "voucher", Max: 3, Lifetime: 10 * time.Minute}
	const c = "payer|key"
	redeem := func() bool {
		t.Helper()
		ds, err := l.Decide(ctx, v.Redeem(c))
		if err != nil {
			t.Fatal(err)
		}
		return ds.Last().Allowed
	}
	grant := func(n int) {
		t.Helper()
		for range n {
			if _, err := l.Decide(ctx, v.Grant(c)); err != nil {
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
	if got != v.Max {
		t.Errorf("5 grants held as %d, want the most held, %d", got, v.Max)
	}

	// One grant step decided twice grants twice: each call names its grant afresh.
	g := v.Grant(c)
	for range 2 {
		if _, err := l.Decide(ctx, g); err != nil {
			t.Fatal(err)
		}
	}
	if !redeem() || !redeem() || redeem() {
		t.Error("one grant step decided twice: want two redemptions, then none")
	}

	grant(3)
	var taken atomic.Int64
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			if ds, err := l.Decide(ctx, v.Redeem(c)); err == nil && ds.Last().Allowed {
				taken.Add(1)
			}
		})
	}
	wg.Wait()
	if n := taken.Load(); n != 3 {
		t.Errorf("20 concurrent redemptions of 3 grants took %d, want 3", n)
	}
}

// TestVouchersFollowTheirModel: thousands of random grants and redemptions, the clock stepping
// past their lifetime, decided by voucher.lua and by a Go model (the grants' times, oldest
// first): every verdict and count of grants held agree.
func TestVouchersFollowTheirModel(t *testing.T) {
	clk := clocktest.New()
	l := limiter(t, clk)
	v := grants.Vouchers{Name: "model", Max: 3, Lifetime: time.Second}
	var held []time.Time // the model: each grant's time, oldest first
	rng := rand.New(rand.NewPCG(48, 49))
	ctx := context.Background()
	redeemed, expired := 0, 0
	for i := range 3000 {
		if rng.IntN(10) == 0 {
			clk.Add(v.Lifetime) // a grant of the last step expires exactly now
		} else {
			clk.Wander(rng, 150*time.Millisecond, 3*time.Second)
		}
		now := clk.Now()
		for len(held) > 0 && !held[0].After(now.Add(-v.Lifetime)) {
			held, expired = held[1:], expired+1
		}
		grant := rng.IntN(2) == 0
		step, want := v.Redeem("payer"), len(held) > 0
		if grant {
			step, want = v.Grant("payer"), true
			held = append(held, now)
			held = held[max(0, len(held)-v.Max):]
		} else if want {
			held, redeemed = held[1:], redeemed+1
		}
		ds, err := l.Decide(ctx, step)
		if err != nil {
			t.Fatal(err)
		}
		if got := ds.Last(); got.Allowed != want || got.Worst.Remaining != len(held) {
			t.Fatalf("step %d (grant %v): script allowed %v, %d held; model %v, %d", i, grant, got.Allowed, got.Worst.Remaining, want, len(held))
		}
	}
	if redeemed < 100 || expired < 100 {
		t.Fatalf("%d redeemed, %d expired in 3000 steps: the trace hardly tried either", redeemed, expired)
	}
}
