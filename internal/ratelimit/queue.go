package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The leaky bucket as a queue (LeakyBucket, leaky_bucket.lua): a decision that finds a place
// comes back admitted with a Wait, and its caller holds the request until its turn (Wait). The
// meters refuse what is over the limit; the queue also delays, which costs the replica a
// goroutine and the client a connection per waiter: Options.MaxWaiting bounds the first, the
// queue's places (Policy.Queue) and the caller's deadline the second.
//
// A waiter whose caller gives up (its context ends) gives its place back, and the turns after it
// move up in Redis. The replica that gave it back moves its own waiters at once; the others hear
// of it on QueueChannel (the API subscribes, as to ForgetChannel) and move theirs. A replica
// that does not hear it serves its waiters at their old turns: later than they could be, and one
// of them may then share its turn with the request that took the freed place at the end.

// ErrTooManyWaiting is returned by Wait when this replica already holds Options.MaxWaiting
// waiters: the request's place is given back.
var ErrTooManyWaiting = errors.New("too many requests waiting in this replica")

// place is an admitted queue decision's place, for Wait.
type place struct {
	key     string
	owner   string // its identity (an account): whose share of the waiting places it takes
	id      string
	turn    int64 // Redis µs
	decided int64 // when its turn was given, Redis µs: a move made after it is already counted in it
	policy  Policy
	local   bool // a place in the fallback's memory queue, not in Redis
}

// waiter is a request held until its turn.
type waiter struct {
	turn    int64     // its turn in Redis µs (the replica's, local): moves name the turns after a leaver's
	decided int64     // when its turn was given, on the same clock
	local   bool      // its place is in the fallback's memory queue: only that queue's moves move it
	due     time.Time // its turn on this replica's clock
	moved   chan struct{}
}

// waiters are this replica's waiters, by key, for the moves.
type waiters struct {
	max   int64
	count atomic.Int64

	mu    sync.Mutex
	byKey map[string]map[*waiter]struct{}
	// byOwner counts the waiters of each identity (an account), whatever its keys: a PIX queue
	// and a statement queue of one account share its half.
	byOwner map[string]int64
	// moves are the recent moves by key, for a waiter decided before one and registered after it
	// (its decision's reply was on its way back): add applies them. Kept a minute, longer than
	// any wait.
	moves map[string][]queueMove
}

// queueMove is one leave's move: the turns after `after`, given before `at`, up by `by` µs.
type queueMove struct {
	after, by, at int64
	local         bool
	seen          time.Time
}

// keepMoves is how long a move is kept for the waiters still to register.
const keepMoves = time.Minute

func newWaiters(max int) *waiters {
	return &waiters{max: int64(max), byKey: map[string]map[*waiter]struct{}{}, byOwner: map[string]int64{},
		moves: map[string][]queueMove{}}
}

// full reports whether the replica holds as many waiters as it may, in all or of owner.
func (ws *waiters) full(owner string) bool {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return ws.fullLocked(owner)
}

// fullLocked is full with ws.mu held: every place taken, or half of them (at least 1) by owner,
// one account whatever its queues, so that one payroll never takes every place.
func (ws *waiters) fullLocked(owner string) bool {
	return ws.count.Load() >= ws.max || ws.byOwner[owner] >= max(1, ws.max/2)
}

// soonest is the time until the first of this replica's waiters is served: when a waiter's room
// frees here. A pace when none waits (a race: the waiters left meanwhile).
func (ws *waiters) soonest(now time.Time, pace time.Duration) time.Duration {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	soonest := pace
	for _, k := range ws.byKey {
		for w := range k {
			soonest = min(soonest, max(w.due.Sub(now), time.Millisecond))
		}
	}
	return soonest
}

// add registers w on key for owner, unless the replica holds its maximum, or owner (one account)
// holds half of it already (at least 1): one account's payroll never takes every place.
func (ws *waiters) add(key, owner string, w *waiter) bool {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.fullLocked(owner) {
		return false
	}
	ws.count.Add(1)
	ws.byOwner[owner]++
	if ws.byKey[key] == nil {
		ws.byKey[key] = map[*waiter]struct{}{}
	}
	ws.byKey[key][w] = struct{}{}
	for _, m := range ws.moves[key] { // in the order they were made
		m.apply(w)
	}
	return true
}

// apply moves w as m says, if m moves it.
func (m queueMove) apply(w *waiter) {
	if w.local == m.local && w.turn > m.after && w.decided < m.at {
		w.turn -= m.by
		w.due = w.due.Add(-time.Duration(m.by) * time.Microsecond)
		select {
		case w.moved <- struct{}{}:
		default:
		}
	}
}

func (ws *waiters) remove(key, owner string, w *waiter) {
	ws.mu.Lock()
	delete(ws.byKey[key], w)
	if len(ws.byKey[key]) == 0 {
		delete(ws.byKey, key)
	}
	if ws.byOwner[owner]--; ws.byOwner[owner] <= 0 {
		delete(ws.byOwner, owner)
	}
	ws.count.Add(-1)
	ws.mu.Unlock()
}

// move moves the waiters on key whose turn is after `after`, given before the leave made at `at`,
// up by `by` µs: those of the Redis queue, or with local those of the fallback's (their times are
// on the replica's clock). A turn given at or after the leave was counted from the moved queue
// already (in the same microsecond: not moved, so never early). The move is kept for the waiters
// decided before it that have yet to register.
func (ws *waiters) move(key string, after, by, at int64, local bool) {
	if by <= 0 {
		return
	}
	m := queueMove{after: after, by: by, at: at, local: local, seen: time.Now()}
	ws.mu.Lock()
	defer ws.mu.Unlock()
	for w := range ws.byKey[key] {
		m.apply(w)
	}
	kept := ws.moves[key][:0]
	for _, old := range ws.moves[key] {
		if time.Since(old.seen) < keepMoves {
			kept = append(kept, old)
		}
	}
	ws.moves[key] = append(kept, m)
	if len(ws.moves) > 1000 { // many keys: drop those with no recent move
		for k, ms := range ws.moves {
			if time.Since(ms[len(ms)-1].seen) >= keepMoves {
				delete(ws.moves, k)
			}
		}
	}
}

// dueOf reads w's due time.
func (ws *waiters) dueOf(w *waiter) time.Time {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return w.due
}

// Wait holds an admitted decision until its turn: at once for every decision but a queue's
// (LeakyBucket) whose Wait is above zero. It returns nil at the turn; when ctx ends first, it
// gives the place back (the turns after it move up) and returns ctx's error. With
// Options.MaxWaiting requests already waiting here, or half of them (at least 1) of d's identity
// (one account, whatever its queues), it gives the place back and returns ErrTooManyWaiting at once. A caller that takes a queue's place and then does not want it
// (a shadow policy serves at once) need not call Wait: the place is served at its turn anyway.
func (l *Limiter) Wait(ctx context.Context, d Decision) error {
	p := d.place
	if !d.Allowed || p == nil || d.Wait <= 0 {
		return nil
	}
	start := time.Now() // the timer runs on the real clock, whatever the Limiter decides with
	w := &waiter{turn: p.turn, decided: p.decided, local: p.local, due: start.Add(d.Wait), moved: make(chan struct{}, 1)}
	if !l.waiters.add(p.key, p.owner, w) {
		l.leave(p)
		return ErrTooManyWaiting
	}
	defer l.waiters.remove(p.key, p.owner, w)
	for {
		wait := time.Until(l.waiters.dueOf(w))
		if wait <= 0 {
			return nil
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
			return nil
		case <-w.moved:
			t.Stop()
		case <-ctx.Done():
			t.Stop()
			l.leave(p)
			return ctx.Err()
		}
	}
}

// leave gives p back: in Redis (or the fallback's memory), and the turns after it move up,
// here at once and on the other replicas by QueueChannel.
func (l *Limiter) leave(p *place) {
	if p.local {
		now := l.clock().UnixMicro()
		turn, moved := l.fallback.leave(p.key, p.id, now, paceOf(p.policy))
		l.waiters.move(p.key, turn, moved, now, true)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), l.timeout)
	defer cancel()
	c := l.newCall(LeakyBucket, Op{kind: opWithdraw, at: p.turn}, []Check{{Policy: p.policy}})
	c.ID = p.id
	vals, err := scripts[LeakyBucket].Run(ctx, l.rdb, []string{p.key}, c.Args()...).Int64Slice()
	if err != nil || len(vals) != 4 {
		return // the place is served at its turn, unused: the queue loses a turn, never admits one more
	}
	turn, moved, at := vals[1], vals[2], vals[3]
	if vals[0] == 0 || moved <= 0 {
		return
	}
	l.waiters.move(p.key, turn, moved, at, false)
	// The others' waiters; this replica skips its own message (its waiters have moved).
	msg := strings.Join([]string{p.key, strconv.FormatInt(turn, 10), strconv.FormatInt(moved, 10), strconv.FormatInt(at, 10), l.id}, " ")
	_ = publishScript.Run(ctx, l.rdb, []string{l.queueChannel()}, msg).Err() // unheard: see the top of this file
}

// queueChannel is the Redis channel on which a replica announces the turns that moved up when
// one of its waiters left; every Limiter whose client can subscribe hears it (listen).
func (l *Limiter) queueChannel() string { return l.keys.prefix + ":{fleet}:queue" }

// moved moves this replica's waiters as a message on queueChannel says: "key after by at sender",
// the turns of key after `after` given before `at` (Redis µs) move up by `by` µs. A replica's own
// messages are skipped: it moved its waiters when it sent them.
func (l *Limiter) moved(msg string) {
	f := strings.Fields(msg)
	if len(f) != 5 || f[4] == l.id {
		return
	}
	after, err1 := strconv.ParseInt(f[1], 10, 64)
	by, err2 := strconv.ParseInt(f[2], 10, 64)
	at, err3 := strconv.ParseInt(f[3], 10, 64)
	if err1 == nil && err2 == nil && err3 == nil {
		l.waiters.move(f[0], after, by, at, false)
	}
}

// paceOf is p's pace: the time between two turns, µs.
func paceOf(p Policy) float64 {
	return float64(p.Window.Microseconds()) / float64(p.Limit)
}

// tooManyWaiting is the refusal of a queue's request while this replica holds its maximum of
// waiters: no place taken, and a Retry-After until the first of them is served.
func (l *Limiter) tooManyWaiting(checks []Check) Decision {
	c := checks[0]
	retry := l.waiters.soonest(time.Now(), time.Duration(paceOf(c.Policy))*time.Microsecond)
	r := Result{Policy: c.Policy, Capacity: c.Policy.Capacity(), Reset: retry, RetryAfter: retry}
	return Decision{Worst: r, Results: []Result{r}}
}

// queueKey is one queue's places in memory, decided as leaky_bucket.lua decides them in Redis:
// the fallback's queue (AllowFallback), and the statement the script is tested against.
type queueKey struct {
	turns []float64 // ascending
	ids   []string
}

// take decides one request at now (µs) on a queue of the given pace (µs) and places: with
// record, it takes its place when admitted; maxWait < 0 waits as long as the queue. It returns
// what the script replies.
func (q *queueKey) take(now int64, pace float64, places int, maxWait int64, id string, record bool) (admitted bool, remaining, reset, wait int64) {
	t := float64(now)
	cut := 0
	for cut < len(q.turns) && q.turns[cut] <= t-pace {
		cut++
	}
	q.turns, q.ids = q.turns[cut:], q.ids[cut:]
	turn := t
	if len(q.turns) > 0 {
		turn = math.Max(t, q.turns[len(q.turns)-1]+pace)
	}
	waiting := 0
	for _, x := range q.turns {
		if x > t {
			waiting++
		}
	}
	room := waiting < places
	fits := maxWait < 0 || turn-t <= float64(maxWait)
	admitted = room && fits
	if admitted && record {
		q.turns, q.ids = append(q.turns, turn), append(q.ids, id)
		if turn > t {
			waiting++
		}
	}
	for _, x := range q.turns {
		if x > t {
			reset = int64(math.Ceil(x - t))
			break
		}
	}
	if !admitted && !fits && room {
		reset = int64(math.Ceil(turn - t - float64(maxWait)))
	}
	if admitted {
		remaining = int64(max(0, places-waiting))
		wait = int64(math.Ceil(turn - t))
	}
	return admitted, remaining, reset, wait
}

// leave gives id's place back at now (µs) and moves the turns after it up, as the script does;
// it returns the place's turn and how far the others moved (µs), or 0, 0 when it was not there.
func (q *queueKey) leave(now int64, pace float64, id string) (turn, moved int64) {
	i := slices.Index(q.ids, id)
	if i < 0 {
		return 0, 0
	}
	t := q.turns[i]
	q.turns, q.ids = slices.Delete(q.turns, i, i+1), slices.Delete(q.ids, i, i+1)
	first := float64(now)
	if i > 0 {
		first = math.Max(q.turns[i-1]+pace, float64(now))
	}
	var by float64
	if i < len(q.turns) {
		by = math.Max(0, q.turns[i]-first)
	}
	if by > 0 {
		for j := i; j < len(q.turns); j++ {
			q.turns[j] -= by
		}
	}
	return int64(math.Ceil(t)), int64(math.Floor(by))
}

// queued says whether checks decide a queue.
func queued(checks []Check) bool { return checks[0].Policy.algorithm() == LeakyBucket }

// oneQueue refuses a queue decided together with other keys: each queue gives its own turn.
func oneQueue(checks []Check) error {
	if len(checks) > 1 && slices.ContainsFunc(checks, func(c Check) bool { return c.Policy.algorithm() == LeakyBucket }) {
		return fmt.Errorf("ratelimit: a leaky_bucket policy decides one key at a time, not %d", len(checks))
	}
	return nil
}
