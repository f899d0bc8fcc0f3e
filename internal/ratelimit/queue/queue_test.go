package queue

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pixlimit/pixlimit/internal/ratelimit"
	"github.com/pixlimit/pixlimit/internal/testing/redistest"
	"github.com/pixlimit/pixlimit/internal/testing/stalls"
)

type (
	Check  = ratelimit.Check
	Policy = ratelimit.Policy
)

var testSecret = []byte("0123456789abcdef0123456789abcdef")

// budget is the decisions' budget: a second, which no loaded machine outlasts.
const budget = time.Second

// replicas are n Queues on srv, each in front of a Limiter of its own client, holding at most
// maxWaiting waiters (0: the default).
func replicas(t *testing.T, srv *redistest.Server, n, maxWaiting int) []*Queue {
	t.Helper()
	qs := make([]*Queue, n)
	for i := range qs {
		rdb := srv.Client(func(o *redis.Options) { ratelimit.ClientOptions(o, budget) })
		l, err := ratelimit.New(rdb, ratelimit.Options{KeySecret: testSecret, Timeout: budget})
		if err != nil {
			t.Fatal(err)
		}
		qs[i] = New(l, rdb, Options{MaxWaiting: maxWaiting, Timeout: budget})
		t.Cleanup(func() { _ = qs[i].Close() })
	}
	return qs
}

// waitFor polls cond until it holds, and fails the test if it does not within 10 s (a state a
// starved machine let pass by, or never reached).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not within 10s: %s", what)
		}
	}
}

// mustAllow decides checks through q, failing the test on an error.
func mustAllow(t *testing.T, q *Queue, checks ...Check) ratelimit.Decision {
	t.Helper()
	d, err := q.AllowAll(context.Background(), checks...)
	if err != nil {
		t.Fatalf("AllowAll: %v", err)
	}
	return d
}

// warm makes q's first decision: connected, scripts loaded.
func warm(t *testing.T, q *Queue) {
	t.Helper()
	mustAllow(t, q, Check{Policy: Policy{Name: "warm", Limit: 1000, Window: time.Minute}, Identity: "w"})
}

// subscribed waits until each of n Queues hears the others' moved turns (each subscribes
// itself), so that no test sends a move before a subscription is in place.
func subscribed(t *testing.T, srv *redistest.Server, n int) {
	t.Helper()
	c := srv.Client(nil)
	defer c.Close()
	ch := Channel("")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		got, err := c.PubSubNumSub(context.Background(), ch).Result()
		if err == nil && got[ch] >= int64(n) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v of %d queues subscribed to %s", got, n, ch)
		}
	}
}

// served is what one queued request saw: admitted or not, when its answer came (since the
// start), and how long it waited for its turn.
type served struct {
	ok     bool
	at     time.Duration
	waited time.Duration
	turn   int64 // the turn Redis gave it, µs on Redis's clock (0: none)
	err    error
}

// queueBurst sends n requests of p at once, spread over ls, each taking its place and waiting
// its turn under ctx, and returns what each saw, in the order they were served.
func queueBurst(ctx context.Context, ls []*Queue, p Policy, id string, n int) []served {
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
			if d.Place != nil {
				out[i].turn = d.Place.Turn
			}
		})
	}
	wg.Wait()
	slices.SortFunc(out, func(a, b served) int { return int(a.at - b.at) })
	return out
}

// TestTheQueueServesQPlusOneAtItsPace: 20 requests at once over three replicas, on a queue of 5
// with a pace of 100 ms: exactly 6 served (one at once, five after their turns), their turns the
// pace apart at least, none served before its turn, and within 10% of the pace on average (the
// machine's stalls aside), and the other 14 refused at once.
func TestTheQueueServesQPlusOneAtItsPace(t *testing.T) {
	srv := redistest.Start(t)
	meter := stalls.Watch(t)
	ls := replicas(t, srv, 3, 0)
	p := Policy{Name: "paced", Limit: 10, Window: time.Second, Algorithm: ratelimit.LeakyBucket, Queue: 5}
	for _, l := range ls {
		warm(t, l)
	}
	start := time.Now()
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
	// The burst's start precedes every decision, so a waiter served at its turn is served at
	// least its turn's distance from the first turn after it: never earlier, however busy the
	// machine; a busy machine only serves later.
	pace := p.Pace()
	for i := 1; i < len(ok); i++ {
		if gap := time.Duration(ok[i].turn-ok[i-1].turn) * time.Microsecond; gap < pace {
			t.Errorf("turns %d and %d given %v apart, want the pace %v at least", i, i+1, gap, pace)
		}
		if early := time.Duration(ok[i].turn-ok[0].turn)*time.Microsecond - ok[i].at; early > 0 {
			t.Errorf("turn %d served %v before it came", i+1, early)
		}
	}
	// Not later than the pace, by 10% on average, but what the machine's stalls held back.
	if measured := meter.Within(start.Add(ok[0].at), start.Add(ok[5].at)) / 5; measured > pace+pace/10 {
		t.Errorf("served every %v on average (the machine's stalls aside), want the pace %v within 10%%", measured, pace)
	}
}

// TestALeaverGivesItsPlaceBack: a waiter whose client goes away gives its place back; the turns
// after it move up, once each, on its own replica (which also hears its own message) and on
// another one by QueueChannel; no two are then served together; and a newcomer finds a place in
// a queue that was full.
func TestALeaverGivesItsPlaceBack(t *testing.T) {
	srv := redistest.Start(t)
	ls := replicas(t, srv, 2, 0)
	subscribed(t, srv, 2)
	meter := stalls.Watch(t)
	// A pace of 500 ms: the four waiters register before the first turn even on a starved machine.
	p := Policy{Name: "leave", Limit: 2, Window: time.Second, Algorithm: ratelimit.LeakyBucket, Queue: 4}
	ctx := context.Background()
	first := mustAllow(t, ls[0], Check{Policy: p, Identity: "co"})
	if first.Wait != 0 {
		t.Fatalf("the first request waits %v, want 0: the queue was empty", first.Wait)
	}
	leaverCtx, leave := context.WithCancel(ctx)
	on := []*Queue{ls[0], ls[0], ls[1], ls[0]} // the second waiter leaves; one behind it on each replica
	var ds []ratelimit.Decision
	for i, l := range on {
		d := mustAllow(t, l, Check{Policy: p, Identity: "co"})
		if !d.Allowed || d.Wait < time.Duration(i+1)*p.Pace()-50*time.Millisecond {
			t.Fatalf("waiter %d: allowed=%v wait %v, want its turn %d paces away", i+1, d.Allowed, d.Wait, i+1)
		}
		ds = append(ds, d)
	}
	if d := mustAllow(t, ls[1], Check{Policy: p, Identity: "co"}); d.Allowed || d.Worst.RetryAfter <= 0 {
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
	waitFor(t, "the four waiters registered before the first turn", func() bool { return ls[0].Waiting() == 3 && ls[1].Waiting() == 1 })
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
	// One pace, then two (moved up from three), then three (from four), each once; late, a busy
	// machine's stalls aside, by a quarter of a pace at most.
	pace := p.Pace()
	for i, a := range at {
		if want := time.Duration(i+1) * pace; a < want-pace/4 || meter.Within(start, start.Add(a)) > want+pace/4 {
			t.Errorf("served at %v, want turn %d at about %v: moved up once (%v)", at, i+1, want, at)
			break
		}
	}
	if d := mustAllow(t, ls[1], Check{Policy: p, Identity: "co"}); !d.Allowed {
		t.Errorf("after a waiter left, a newcomer was refused: its place was not given back")
	}
}

// TestAReplicaHoldsAtMostMaxWaiting: past Options.MaxWaiting, or past half of it on one key, a
// queue's request that would wait is refused: at once, taking no place, behind a waiter of its
// queue; else by Wait, giving its place back. One that would not wait is served.
func TestAReplicaHoldsAtMostMaxWaiting(t *testing.T) {
	srv := redistest.Start(t)
	l := replicas(t, srv, 1, 2)[0]
	// A pace of a second: the first key's waiter is still waiting when the second key's registers.
	p := Policy{Name: "few", Limit: 1, Window: time.Second, Algorithm: ratelimit.LeakyBucket, Queue: 10}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for _, id := range []string{"co", "co", "other", "other"} { // on each key one served at once, one waiting
		d := mustAllow(t, l, Check{Policy: p, Identity: id})
		wg.Go(func() { _ = l.Wait(ctx, d) })
	}
	waitFor(t, "two waiters registered", func() bool { return l.Waiting() == 2 })
	// A third key's first request waits for no one: the replica's waiters are no reason to refuse it.
	if d, err := l.AllowAll(context.Background(), Check{Policy: p, Identity: "third"}); err != nil || !d.Allowed || d.Wait != 0 {
		t.Errorf("a third key's first request beside a replica's 2 waiters: allowed=%v wait %v (%v), want served at once", d.Allowed, d.Wait, err)
	}
	// Its second would wait: the limiter gives it a place, which Wait gives back, refusing it.
	d := mustAllow(t, l, Check{Policy: p, Identity: "third"})
	if err := l.Wait(ctx, d); !d.Allowed || d.Wait <= 0 || !errors.Is(err, ErrTooManyWaiting) {
		t.Errorf("a waiter on a third key of a replica that holds 2: allowed=%v wait %v, Wait %v, want ErrTooManyWaiting", d.Allowed, d.Wait, err)
	}
	if ds, err := l.Decide(context.Background(), ratelimit.AskStep(Check{Policy: p, Identity: "third"})); err != nil || ds.Last().Worst.Remaining != 10 {
		t.Errorf("the third key's queue after a refused waiter: %d free places (%v), want all 10: its place given back, and the first served", ds.Last().Worst.Remaining, err)
	}
	d = mustAllow(t, l, Check{Policy: p, Identity: "co"})
	if d.Allowed || d.Worst.RetryAfter <= 0 || d.Worst.RetryAfter > p.Pace()*2 {
		t.Errorf("a second waiter on a key that holds half the replica's 2: allowed=%v retry %v, want refused until a waiter is served", d.Allowed, d.Worst.RetryAfter)
	}
	ds, err := l.Decide(context.Background(), ratelimit.AskStep(Check{Policy: p, Identity: "co"}))
	asked := ds.Last()
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
// would fit. (A pace of a second: the four decisions, one after another, may take a loaded
// machine's half second and still find the first three turns within the deadline.)
func TestATurnPastTheDeadlineIsRefusedAtOnce(t *testing.T) {
	l := replicas(t, redistest.Start(t), 1, 0)[0]
	p := Policy{Name: "deadline", Limit: 10, Window: 10 * time.Second, Algorithm: ratelimit.LeakyBucket, Queue: 10}
	ctx, cancel := context.WithTimeout(context.Background(), budget+2500*time.Millisecond)
	defer cancel()
	var got []ratelimit.Decision
	for range 4 {
		d, err := l.AllowAll(ctx, Check{Policy: p, Identity: "co"})
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, d)
	}
	if !got[0].Allowed || !got[1].Allowed || !got[2].Allowed {
		t.Fatalf("turns at 0, 1 and 2 s within 2.5: refused (%v)", got)
	}
	if d := got[3]; d.Allowed || d.Worst.RetryAfter <= 0 || d.Worst.RetryAfter > time.Second {
		t.Errorf("a turn at 3 s with 2.5 left: allowed=%v retry %v, want refused, to retry within a pace", d.Allowed, d.Worst.RetryAfter)
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

// TestAKeyKeepsItsLastMoves: a client that takes places and hangs up by the thousand grows no
// list every move and registration reads under the replica's lock: a key keeps its last maxMoves
// moves, and a waiter that registers is moved by those.
func TestAKeyKeepsItsLastMoves(t *testing.T) {
	ws := newWaiters(10)
	const leaves = 10 * maxMoves
	for i := range int64(leaves) {
		ws.move("k", 1_000+i, 1, 100_000+i, false)
	}
	if got := len(ws.moves["k"]); got != maxMoves {
		t.Fatalf("after %d leaves, %d moves kept, want the last %d", leaves, got, maxMoves)
	}
	if got, want := ws.moves["k"][0].at, int64(100_000+leaves-maxMoves); got != want {
		t.Errorf("the oldest move kept was made at %d, want %d (the last ones kept)", got, want)
	}
	w := waiter{turn: 1_000_000, decided: 0, due: time.Now(), moved: make(chan struct{}, 1)}
	if !ws.add("k", "ana", &w) {
		t.Fatal("add refused")
	}
	if got, want := w.turn, int64(1_000_000-maxMoves); got != want {
		t.Errorf("a waiter decided before every leave: turn %d, want %d (moved by each move kept)", got, want)
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

// A refusal's Retry-After is when the refused account finds room: while it holds its half of the
// places, when one of its own waiters is served (another account's turn, sooner, frees none of
// its half); while the replica holds every place, when the first waiter is; never before a waiter
// due later than the pace.
func TestARefusalWaitsForTheWaiterThatFreesItsRoom(t *testing.T) {
	now := time.Now()
	waiting := func(ws *waiters, key, owner string, due time.Duration) {
		t.Helper()
		if !ws.add(key, owner, &waiter{due: now.Add(due), moved: make(chan struct{}, 1)}) {
			t.Fatalf("a waiter of %s not added", owner)
		}
	}
	half := newWaiters(4)
	waiting(half, "pix:payroll", "payroll", time.Second)
	waiting(half, "pix:payroll", "payroll", 2*time.Second)
	waiting(half, "pix:ana", "ana", 100*time.Millisecond)
	if got, want := half.soonest(now, time.Second, "payroll"), time.Second; got != want {
		t.Errorf("payroll holding its half: Retry-After %v, want %v (its own first waiter's turn)", got, want)
	}
	waiting(half, "pix:bruno", "bruno", 300*time.Millisecond)
	if got, want := half.soonest(now, time.Second, "carla"), 100*time.Millisecond; got != want {
		t.Errorf("every place taken: Retry-After %v, want %v (the first waiter's turn)", got, want)
	}
	late := newWaiters(2)
	waiting(late, "pix:ana", "ana", 3*time.Second)
	if got, want := late.soonest(now, time.Second, "ana"), 3*time.Second; got != want {
		t.Errorf("a waiter due past the pace: Retry-After %v, want %v", got, want)
	}
}
