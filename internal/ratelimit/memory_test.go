package ratelimit

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// TestMemoryPerKey measures, with MEMORY USAGE, what one key costs Redis for each algorithm
// when it has admitted as many requests as it holds at once: limit (or burst) 10 and 1000.
//
//	go test -run TestMemoryPerKey -v ./internal/ratelimit
func TestMemoryPerKey(t *testing.T) {
	t.Parallel()
	l, rdb, _ := newTestLimiter(t)
	withClock(l)
	ctx := context.Background()
	for _, a := range meters() {
		for _, limit := range []int{10, 1000} {
			p := Policy{Name: fmt.Sprint("mem", limit), Limit: limit, Window: time.Minute, Algorithm: a}
			for range limit {
				if !mustAllow(t, l, Check{p, "k"}).Allowed {
					t.Fatalf("%s: refused under the limit", a)
				}
			}
			bytes, err := rdb.MemoryUsage(ctx, l.keys.key(p, "k")).Result()
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%-14s limit %4d: %6d bytes", a, limit, bytes)
			switch {
			case a == SlidingLog && limit == 10 && bytes >= 500:
				t.Errorf("sliding log at limit 10: %d bytes, want well under 500", bytes)
			case a == SlidingLogPacked && bytes > map[int]int64{10: 150, 1000: 9000}[limit]:
				t.Errorf("packed log at limit %d: %d bytes, want at most %d", limit, bytes, map[int]int64{10: 150, 1000: 9000}[limit])
			case a != SlidingLog && a != SlidingLogPacked && bytes > 160:
				t.Errorf("%s at limit %d: %d bytes, want one short value", a, limit, bytes)
			}
		}
	}
}
