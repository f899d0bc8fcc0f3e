package fallback

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/pixlimit/pixlimit/internal/ratelimit"
	"github.com/pixlimit/pixlimit/internal/testing/redistest"
)

// TestQueueScriptMatchesItsModel drives leaky_bucket.lua and memoryQueue (the Go statement of it,
// which the fallback runs) through the same random trace of takes, asks and leaves, with
// injected time and deadlines, and requires the same reply at every step: admitted, remaining,
// reset, wait; for a leave, its turn and how far the others moved.
func TestQueueScriptMatchesItsModel(t *testing.T) {
	rdb := redistest.Start(t).Client(nil)
	p := ratelimit.Policy{Name: "q", Limit: 10, Window: 7 * time.Second, Algorithm: ratelimit.LeakyBucket, Queue: 4} // a pace of 700 ms
	const key = "q"
	// The script's arguments as its header lays them out: limit, window in ms, the request's id,
	// places, now in µs, the operation ('' takes a place, 'q<µs>' one whose turn is at most µs
	// away, 'a' asks, 'w0' leaves).
	run := func(id string, now int64, op string) ([]int64, error) {
		return ratelimit.Script(ratelimit.LeakyBucket).Run(context.Background(), rdb, []string{key},
			p.Limit, p.Window.Milliseconds(), id, p.Capacity(), now, op).Int64Slice()
	}
	var m memoryQueue
	rng := rand.New(rand.NewPCG(40, 4))
	start, base := time.Now(), int64(1_800_000_000_000_000)
	var jumps int64
	var held []string // ids admitted, to leave from
	seen := map[string]int{}
	for step := range 3000 {
		jumps += int64(rng.IntN(400_000))
		now := base + time.Since(start).Microseconds() + jumps // never behind the real clock: TTLs hold
		id, op, within := ratelimit.RequestID(), "", int64(-1)
		switch r := rng.IntN(10); {
		case r < 3 && len(held) > 0: // a request leaves: mostly a recent one, still waiting
			i := max(0, len(held)-1-rng.IntN(6))
			id = held[i]
			held = slices.Delete(held, i, i+1)
			got, err := run(id, now, "w0")
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
			op = "a"
		case r < 7:
			within = int64(rng.IntN(3_000_000)) // a deadline within 3 s: some turns come past it
			op = fmt.Sprintf("q%d", within)
		}
		vals, err := run(id, now, op)
		if err != nil {
			t.Fatal(err)
		}
		got, err := ratelimit.ParseReply(vals, 1, true)
		if err != nil {
			t.Fatal(err)
		}
		admitted, remaining, reset, wait := m.Take(now, p, within, id, op != "a")
		want := ratelimit.Reply{Allowed: admitted, Pairs: []int64{remaining, reset}, Now: now, Wait: wait}
		if got.Allowed != want.Allowed || !slices.Equal(got.Pairs, want.Pairs) || got.Wait != want.Wait {
			t.Fatalf("step %d (op %q): script %+v, model %+v", step, op, got, want)
		}
		switch {
		case admitted && op != "a":
			held = append(held, id)
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
