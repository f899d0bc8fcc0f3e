package ratelimit

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pixlimit/pixlimit/internal/testing/redistest"
)

// TestQueueScriptMatchesItsModel drives leaky_bucket.lua and queueKey (the Go statement of it,
// which the fallback also runs) through the same random trace of takes, asks and leaves, with
// injected time and deadlines, and requires the same reply at every step: admitted, remaining,
// reset, wait; for a leave, its turn and how far the others moved.
func TestQueueScriptMatchesItsModel(t *testing.T) {
	l, _, _ := newTestLimiter(t)
	p := Policy{Name: "q", Limit: 10, Window: 7 * time.Second, Algorithm: LeakyBucket, Queue: 4} // a pace of 700 ms
	key := l.Key(Check{p, "x"})
	var m queueKey
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
			turn, moved := m.leave(now, paceOf(p), id)
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
		admitted, remaining, reset, wait := m.take(now, paceOf(p), p.Queue, within, c.ID, c.Op.kind != opAsk)
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

// subscribed waits until each of ls hears the others' moved turns (each Limiter subscribes
// itself: listen), so that no test sends a move before a subscription is in place.
func subscribed(t *testing.T, srv *redistest.Server, ls ...*Limiter) {
	t.Helper()
	c := srv.Client(nil)
	defer c.Close()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		n, err := c.PubSubNumSub(context.Background(), ls[0].queueChannel()).Result()
		if err == nil && n[ls[0].queueChannel()] >= int64(len(ls)) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v of %d limiters subscribed to %s", n, len(ls), ls[0].queueChannel())
		}
	}
}

// served is what one queued request saw: admitted or not, when its answer came (since the
// start), and how long it waited for its turn.
type served struct {
	ok     bool
	at     time.Duration
	waited time.Duration
	err    error
}

// queueBurst sends n requests of p at once, spread over ls, each taking its place and waiting
// its turn under ctx, and returns what each saw, in the order they were served.
func queueBurst(ctx context.Context, ls []*Limiter, p Policy, id string, n int) []served {
	out := make([]served, n)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			l := ls[i%len(ls)]
			d, err := l.AllowAll(ctx, Check{Policy: p, Identity: id})
			if err == nil && d.Allowed {
				err = l.Wait(ctx, d)
			}
			out[i] = served{ok: err == nil && d.Allowed, at: time.Since(start), waited: d.Wait, err: err}
		})
	}
	wg.Wait()
	slices.SortFunc(out, func(a, b served) int { return int(a.at - b.at) })
	return out
}

// TestTheQueueServesQPlusOneAtItsPace: 20 requests at once over three replicas, on a queue of 5
// with a pace of 100 ms: exactly 6 served (one at once, five after their turns), at the pace within
// 10% on average, no two closer than half of it, and the other 14 refused at once.
func TestTheQueueServesQPlusOneAtItsPace(t *testing.T) {
	srv := redistest.Start(t)
	ls := replicas(t, srv, 3, generous)
	p := Policy{Name: "paced", Limit: 10, Window: time.Second, Algorithm: LeakyBucket, Queue: 5}
	for _, l := range ls {
		warm(t, l, Check{Policy: policy("warm", 1000, time.Minute), Identity: "w"})
	}
	got := queueBurst(context.Background(), ls, p, "payroll", 20)
	var ok, refused []served
	for _, s := range got {
		if s.err != nil {
			t.Fatal(s.err)
		}
		if s.ok {
			ok = append(ok, s)
		} else {
			refused = append(refused, s)
		}
	}
	if len(ok) != 6 || len(refused) != 14 {
		t.Fatalf("%d served, %d refused: want exactly 6 (a queue of 5 and the one served at once) and 14", len(ok), len(refused))
	}
	// A refusal is at once: it never waits a turn, so it comes before the first waiter's turn.
	// (Half of that turn was the bar, and beside four CPU burners the burst's own refusals took
	// 53-57 ms of a 106 ms turn.)
	for _, s := range refused {
		if s.at >= ok[1].at {
			t.Errorf("a refusal came after %v, while the first turn was at %v: refusals are at once", s.at, ok[1].at)
		}
	}
	measured := (ok[5].at - ok[0].at) / 5 // the pace this run kept
	if pace := p.Pace(); measured < pace-pace/10 || measured > pace+pace/10 {
		t.Errorf("served every %v on average, want the pace %v within 10%%", measured, pace)
	}
	for i := 1; i < len(ok); i++ {
		if gap := ok[i].at - ok[i-1].at; gap < measured/2 {
			t.Errorf("turn %d came %v after the one before, want about the measured pace %v (a busy machine's timers move by milliseconds)", i, gap, measured)
		}
	}
}

// TestALeaverGivesItsPlaceBack: a waiter whose client goes away gives its place back; the turns
// after it move up, once each, on its own replica (which also hears its own message) and on
// another one by QueueChannel; no two are then served together; and a newcomer finds a place in
// a queue that was full.
func TestALeaverGivesItsPlaceBack(t *testing.T) {
	srv := redistest.Start(t)
	ls := replicas(t, srv, 2, generous)
	subscribed(t, srv, ls...)
	p := Policy{Name: "leave", Limit: 5, Window: time.Second, Algorithm: LeakyBucket, Queue: 4} // a pace of 200 ms
	ctx := context.Background()
	first := mustAllow(t, ls[0], Check{p, "co"})
	if first.Wait != 0 {
		t.Fatalf("the first request waits %v, want 0: the queue was empty", first.Wait)
	}
	leaverCtx, leave := context.WithCancel(ctx)
	on := []*Limiter{ls[0], ls[0], ls[1], ls[0]} // the second waiter leaves; one behind it on each replica
	var ds []Decision
	for i, l := range on {
		d := mustAllow(t, l, Check{p, "co"})
		if !d.Allowed || d.Wait < time.Duration(i+1)*p.Pace()-50*time.Millisecond {
			t.Fatalf("waiter %d: allowed=%v wait %v, want its turn %d paces away", i+1, d.Allowed, d.Wait, i+1)
		}
		ds = append(ds, d)
	}
	if d := mustAllow(t, ls[1], Check{p, "co"}); d.Allowed || d.Worst.RetryAfter <= 0 {
		t.Fatalf("a fifth waiter: allowed=%v retry %v, want refused until a place frees", d.Allowed, d.Worst.RetryAfter)
	}
	start := time.Now()
	type served struct {
		i  int
		at time.Duration
	}
	done := make(chan served, len(on))
	errs := make([]error, len(on))
	for i, l := range on {
		wctx := ctx
		if i == 1 {
			wctx = leaverCtx
		}
		go func() { errs[i] = l.Wait(wctx, ds[i]); done <- served{i, time.Since(start)} }()
	}
	for ls[0].Stats().Waiting != 3 || ls[1].Stats().Waiting != 1 {
		time.Sleep(time.Millisecond) // the four are registered
	}
	leave()
	var at []time.Duration
	for range on {
		if s := <-done; s.i != 1 {
			at = append(at, s.at)
		}
	}
	slices.Sort(at)
	if !errors.Is(errs[1], context.Canceled) || errs[0] != nil || errs[2] != nil || errs[3] != nil {
		t.Fatalf("waits ended %v: want the leaver's canceled, the others served", errs)
	}
	// One pace, then two (moved up from three), then three (from four), each once.
	pace := p.Pace()
	for i, a := range at {
		if want := time.Duration(i+1) * pace; a < want-pace/4 || a > want+pace/4 {
			t.Errorf("served at %v, want turn %d at about %v: moved up once (%v)", at, i+1, want, at)
			break
		}
	}
	if d := mustAllow(t, ls[1], Check{p, "co"}); !d.Allowed {
		t.Errorf("after a waiter left, a newcomer was refused: its place was not given back")
	}
}

// TestAReplicaHoldsAtMostMaxWaiting: past Options.MaxWaiting, or past half of it on one key, a
// queue's request is refused at once, taking no place.
func TestAReplicaHoldsAtMostMaxWaiting(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(nil)
	l, err := New(c, Options{KeySecret: testSecret, MaxWaiting: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	p := Policy{Name: "few", Limit: 10, Window: time.Second, Algorithm: LeakyBucket, Queue: 10}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for _, id := range []string{"co", "co", "other", "other"} { // on each key one served at once, one waiting
		d := mustAllow(t, l, Check{p, id})
		wg.Go(func() { _ = l.Wait(ctx, d) })
	}
	for l.Stats().Waiting != 2 {
		time.Sleep(time.Millisecond)
	}
	if d, err := l.AllowAll(context.Background(), Check{p, "third"}); err != nil || d.Allowed {
		t.Errorf("a waiter on a third key of a replica that holds 2: allowed=%v (%v), want refused", d.Allowed, err)
	}
	d := mustAllow(t, l, Check{p, "co"})
	if d.Allowed || d.Worst.RetryAfter <= 0 || d.Worst.RetryAfter > p.Pace()*2 {
		t.Errorf("a second waiter on a key that holds half the replica's 2: allowed=%v retry %v, want refused until a waiter is served", d.Allowed, d.Worst.RetryAfter)
	}
	asked, err := lastOf(l.Decide(context.Background(), AskStep(Check{p, "co"})))
	if err != nil {
		t.Fatal(err)
	}
	if asked.Worst.Remaining != 9 {
		t.Errorf("the queue has %d free places, want 9: the refusal took none", asked.Worst.Remaining)
	}
	cancel()
	wg.Wait()
}

// TestATurnPastTheDeadlineIsRefusedAtOnce: a request whose turn would come after its context's
// deadline, less the decision's own budget, is refused at once, with the time until its turn
// would fit.
func TestATurnPastTheDeadlineIsRefusedAtOnce(t *testing.T) {
	l, _, _ := newTestLimiter(t)
	p := Policy{Name: "deadline", Limit: 10, Window: time.Second, Algorithm: LeakyBucket, Queue: 10}
	ctx, cancel := context.WithTimeout(context.Background(), l.timeout+250*time.Millisecond)
	defer cancel()
	var got []Decision
	for range 4 {
		d, err := l.AllowAll(ctx, Check{Policy: p, Identity: "co"})
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, d)
	}
	if !got[0].Allowed || !got[1].Allowed || !got[2].Allowed {
		t.Fatalf("turns at 0, 100 and 200 ms within 250: refused (%v)", got)
	}
	if d := got[3]; d.Allowed || d.Worst.RetryAfter <= 0 || d.Worst.RetryAfter > 100*time.Millisecond {
		t.Errorf("a turn at 300 ms with 250 left: allowed=%v retry %v, want refused, to retry within a pace", d.Allowed, d.Worst.RetryAfter)
	}
}

// TestTheFallbackQueuesAtItsShare: with Redis unable to decide, a replica of a fleet of 2 paces a
// queue of L per window and Q places at ⌈L/2⌉ and ⌈Q/2⌉.
func TestTheFallbackQueuesAtItsShare(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	l, err := New(c, Options{KeySecret: testSecret, FleetSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	withClock(l)
	p := Policy{Name: "local", Limit: 10, Window: time.Second, Algorithm: LeakyBucket, Queue: 5}
	var waits []time.Duration
	for range 5 {
		d := l.AllowFallback(context.Background(), Check{p, "co"})
		if !d.Allowed {
			break
		}
		waits = append(waits, d.Wait)
	}
	// ⌈10/2⌉ = 5 per second: a pace of 200 ms; ⌈5/2⌉ = 3 places.
	if want := []time.Duration{0, 200 * time.Millisecond, 400 * time.Millisecond, 600 * time.Millisecond}; !slices.Equal(waits, want) {
		t.Errorf("waits %v, want %v", waits, want)
	}
}

// TestAMoveReachesAWaiterThatRegistersAfterIt: a waiter decided before a leave, whose decision's
// reply was still on its way when the move came, is moved when it registers; one decided after
// the leave is not (its turn already counts from the moved queue); and a move of the Redis queue
// never moves a waiter of the fallback's memory queue.
func TestAMoveReachesAWaiterThatRegistersAfterIt(t *testing.T) {
	ws := newWaiters(10)
	now := time.Now()
	ws.move("k", 1_000, 200, 5_000, false) // the turns after 1,000 given before 5,000 move up by 200 µs
	for _, tt := range []struct {
		name     string
		w        waiter
		wantTurn int64
	}{
		{"decided before, registered after", waiter{turn: 1_200, decided: 4_000}, 1_000},
		{"decided after the leave", waiter{turn: 1_200, decided: 6_000}, 1_200},
		{"a turn before the leaver's", waiter{turn: 900, decided: 4_000}, 900},
		{"the fallback's", waiter{turn: 1_200, decided: 4_000, local: true}, 1_200},
	} {
		w := tt.w
		w.due, w.moved = now, make(chan struct{}, 1)
		if !ws.add("k", "ana", &w) {
			t.Fatal("add refused")
		}
		if w.turn != tt.wantTurn || w.due != now.Add(time.Duration(w.turn-tt.w.turn)*time.Microsecond) {
			t.Errorf("%s: turn %d, want %d", tt.name, w.turn, tt.wantTurn)
		}
		ws.remove("k", "ana", &w)
	}
}

// TestOneAccountHoldsAtMostHalfTheWaiters: of a replica's 5 waiting places, one account holds at
// most 2, whatever its queues (its PIX and its statements), so a payroll account never takes
// every place; with 1 place, that one.
func TestOneAccountHoldsAtMostHalfTheWaiters(t *testing.T) {
	ws := newWaiters(5)
	for _, tt := range []struct {
		key, owner string
		want       bool
	}{
		{"pix:payroll", "payroll", true}, {"statement:payroll", "payroll", true}, {"pix:payroll", "payroll", false},
		{"statement:payroll", "payroll", false}, {"pix:ana", "ana", true}, {"pix:ana", "ana", true}, {"pix:bruno", "bruno", true},
		{"pix:bruno", "bruno", false},
	} {
		if got := ws.add(tt.key, tt.owner, &waiter{moved: make(chan struct{}, 1)}); got != tt.want {
			t.Errorf("a waiter on %s with %d waiting: added %v, want %v", tt.key, ws.count.Load(), got, tt.want)
		}
	}
	one := newWaiters(1)
	if !one.add("pix:payroll", "payroll", &waiter{moved: make(chan struct{}, 1)}) {
		t.Error("the only place of a replica of THROTTLE_MAX_WAITING 1: refused, want it given")
	}
}
