package ratelimit

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// TestQueueScriptMatchesItsModel drives leaky_bucket.lua and MemoryQueue (the Go statement of it,
// which the fallback also runs) through the same random trace of takes, asks and leaves, with
// injected time and deadlines, and requires the same reply at every step: admitted, remaining,
// reset, wait; for a leave, its turn and how far the others moved.
func TestQueueScriptMatchesItsModel(t *testing.T) {
	l, _, _ := newTestLimiter(t)
	p := Policy{Name: "q", Limit: 10, Window: 7 * time.Second, Algorithm: LeakyBucket, Queue: 4} // a pace of 700 ms
	key := l.Key(Check{p, "x"})
	var m MemoryQueue
	rng := rand.New(rand.NewPCG(40, 4))
	start, base := time.Now(), int64(1_800_000_000_000_000)
	var jumps int64
	var held []string // ids admitted, to leave from
	seen := map[string]int{}
	for step := range 3000 {
		jumps += int64(rng.IntN(400_000))
		now := base + time.Since(start).Microseconds() + jumps // never behind the real clock: TTLs hold
		c := l.newCall(LeakyBucket, Op{kind: opQueue, within: -1}, []Check{{p, "x"}})
		c.Now = now
		switch r := rng.IntN(10); {
		case r < 3 && len(held) > 0: // a request leaves: mostly a recent one, still waiting
			i := max(0, len(held)-1-rng.IntN(6))
			id := held[i]
			held = slices.Delete(held, i, i+1)
			c.ID, c.Op = id, Op{kind: opWithdraw}
			got, err := scripts[LeakyBucket].Run(context.Background(), l.rdb, []string{key}, c.Args()...).Int64Slice()
			if err != nil {
				t.Fatal(err)
			}
			turn, moved := m.Leave(now, p, id)
			want := []int64{0, 0, 0, now}
			if turn != 0 {
				want = []int64{1, turn, moved, now}
				seen["left"]++
				if moved > 0 {
					seen["moved"]++
				}
			}
			if !slices.Equal(got, want) {
				t.Fatalf("step %d: leave replied %v, model %v", step, got, want)
			}
			continue
		case r < 4:
			c.Op = Op{kind: opAsk}
		case r < 7:
			c.Op.within = int64(rng.IntN(3_000_000)) // a deadline within 3 s: some turns come past it
		}
		got, err := run(context.Background(), l.rdb, LeakyBucket, []string{key}, c)
		if err != nil {
			t.Fatal(err)
		}
		within := c.Op.within
		if c.Op.kind == opAsk {
			within = -1
		}
		admitted, remaining, reset, wait := m.Take(now, p, within, c.ID, c.Op.kind != opAsk)
		want := Reply{Allowed: admitted, Pairs: []int64{remaining, reset}, Now: now, Wait: wait}
		if got.Allowed != want.Allowed || !slices.Equal(got.Pairs, want.Pairs) || got.Wait != want.Wait {
			t.Fatalf("step %d (op %q): script %+v, model %+v", step, c.Op.Arg(), got, want)
		}
		switch {
		case admitted && c.Op.kind != opAsk:
			held = append(held, c.ID)
			seen["admitted"]++
			if wait > 0 {
				seen["waits"]++
			}
		case !admitted && remaining == 0 && reset > 0:
			seen["refused"]++
		}
	}
	for _, what := range []string{"admitted", "waits", "refused", "left", "moved"} {
		if seen[what] < 50 {
			t.Errorf("%s only %d times: the trace did not exercise it (%v)", what, seen[what], seen)
		}
	}
}
