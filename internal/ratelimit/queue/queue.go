// Package queue is the leaky bucket as a queue, the replica's side of it: a decision of a
// LeakyBucket policy that finds a place in Redis comes back admitted with a Wait (the core's
// leaky_bucket.lua gives the turns), and Queue.Wait holds the request until its turn. It owns the
// waiters of this replica, their bound, and the moves of their turns when one of them leaves.
//
// What it buys: a burst over the limit is served at its pace instead of refused (a payroll of
// PIX goes through, one every pace). What it costs: a goroutine on the replica and a connection
// of the client per waiter, bounded by Options.MaxWaiting (one account at most half of them), the
// queue's places (Policy.Queue) and the caller's deadline; one subscription per replica; and a
// refusal that names this replica's load, not the limit, when it holds its most waiters.
//
// A waiter whose caller gives up (its context ends) gives its place back, and the turns after it
// move up in Redis. The replica that gave it back moves its own waiters at once; the others hear
// of it on the fleet's queue channel and move theirs. A replica that does not hear it serves its
// waiters at their old turns: later than they could be, and one of them may then share its turn
// with the request that took the freed place at the end.
package queue

import (
	"cmp"
	"context"
	"crypto/rand"
	_ "embed"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pixlimit/pixlimit/internal/ratelimit"
)

// ErrTooManyWaiting is returned by Wait when this replica already holds Options.MaxWaiting
// waiters: the request's place is given back.
var ErrTooManyWaiting = errors.New("too many requests waiting in this replica")

// Options configure a Queue. The zero value of each field has a default.
type Options struct {
	// MaxWaiting is the most requests this replica holds until their turns at once, over every
	// queue, one identity (an account) at most half of them (at least 1): past it, a queue's
	// request that would wait is refused (one served at once is not). Default 1000.
	MaxWaiting int
	// Prefix is the Limiter's key prefix ("": its default), which names the fleet's channel.
	Prefix string
	// Timeout is the budget of a leave's call. Default 100ms.
	Timeout time.Duration
	// Now is the Limiter's clock (ratelimit.Options.Now): tests only.
	Now func() time.Time
}

// Queue is a ratelimit.Decider in front of another: it refuses a queue's request at once when
// this replica holds its most waiters, and holds the admitted ones until their turns (Wait).
type Queue struct {
	next    ratelimit.Decider
	rdb     redis.Scripter
	id      string // this replica among the fleet's: its messages' sender
	channel string
	timeout time.Duration
	now     func() time.Time
	waiters *waiters

	sub       *redis.PubSub
	listening sync.WaitGroup
}

// New returns a Queue in front of next, whose Limiter keeps its state in rdb. When rdb can
// subscribe, the Queue hears the turns that moved on the other replicas.
func New(next ratelimit.Decider, rdb redis.Scripter, opts Options) *Queue {
	q := &Queue{next: next, rdb: rdb, id: rand.Text(), channel: Channel(opts.Prefix), timeout: cmp.Or(opts.Timeout, 100*time.Millisecond),
		now: opts.Now, waiters: newWaiters(cmp.Or(opts.MaxWaiting, 1000))}
	if s, ok := rdb.(interface {
		Subscribe(ctx context.Context, channels ...string) *redis.PubSub
	}); ok {
		q.sub = s.Subscribe(context.Background(), q.channel)
		q.listening.Add(1) // Close waits for it
		go func() {
			defer q.listening.Done()
			for msg := range q.sub.Channel() {
				q.moved(msg.Payload)
			}
		}()
	}
	return q
}

//go:embed moved.lua
var movedSource string

// moved announces moved turns on Channel.
var movedScript = redis.NewScript(movedSource)

// Channel is the Redis channel on which a replica announces the turns that moved up when one of
// its waiters left, for keys of prefix ("": the default).
func Channel(prefix string) string {
	return cmp.Or(prefix, ratelimit.DefaultPrefix) + ":{fleet}:queue"
}

// AllowAll is next's, refused at once for a queue's request that would wait while this replica
// holds its most waiters (no place taken: Refusal).
func (q *Queue) AllowAll(ctx context.Context, checks ...ratelimit.Check) (ratelimit.Decision, error) {
	if len(checks) == 1 {
		if d, full := q.Refusal(checks[0], false); full {
			return d, nil
		}
	}
	return q.next.AllowAll(ctx, checks...)
}

// Decide is next's, stopped at a step that takes a place in a queue (StepScript.Queues) that would
// wait while this replica holds its most waiters (Refusal): the steps before it are reported
// admitted, unasked, with their keys' capacity as Remaining, and it refused.
func (q *Queue) Decide(ctx context.Context, steps ...ratelimit.Step) (ratelimit.Decisions, error) {
	for i, s := range steps {
		if !s.Script().Queues {
			continue
		}
		if d, full := q.Refusal(s.Checks()[0], false); full {
			ds := make([]ratelimit.Decision, 0, i+1)
			for _, s := range steps[:i] {
				ds = append(ds, unasked(s.Checks()))
			}
			return ratelimit.DecisionsOf(steps, append(ds, d)...), nil
		}
	}
	return q.next.Decide(ctx, steps...)
}

// unasked is the decision of checks not asked: admitted, each with its capacity as Remaining.
func unasked(checks []ratelimit.Check) ratelimit.Decision {
	d := ratelimit.Decision{Allowed: true, Results: make([]ratelimit.Result, len(checks))}
	for j, c := range checks {
		d.Results[j] = ratelimit.Result{Policy: c.Policy, Capacity: c.Policy.Capacity(), Remaining: c.Policy.Capacity()}
	}
	d.Worst = d.Results[0]
	return d
}

// Refusal is the refusal, before any call, of a queue's request of c that would wait while this
// replica holds its most waiters, in all or of c's identity: no place taken, and a Retry-After
// until the first of them is served. It would wait when this replica holds a waiter of c's queue
// (the fallback's memory queue when local, else Redis's): its turn comes after theirs. ok is
// false while there is room, while c's queue has no waiter here (its request may be served at
// once: the limiter decides it, and Wait refuses it if it must wait), or when c is no queue's.
func (q *Queue) Refusal(c ratelimit.Check, local bool) (d ratelimit.Decision, ok bool) {
	if c.Policy.Algorithm != ratelimit.LeakyBucket || !q.waiters.fullBehind(queueOf(c.Policy.Name, c.Identity, local), c.Identity) {
		return ratelimit.Decision{}, false
	}
	retry := q.waiters.soonest(time.Now(), c.Policy.Pace(), c.Identity)
	r := ratelimit.Result{Policy: c.Policy, Capacity: c.Policy.Capacity(), Reset: retry, RetryAfter: retry}
	return ratelimit.Decision{Worst: r, Results: []ratelimit.Result{r}}, true
}

// Waiting is how many requests this replica holds until their turns.
func (q *Queue) Waiting() int { return int(q.waiters.count.Load()) }

// Wait holds an admitted decision until its turn: at once for every decision but a queue's
// (LeakyBucket) whose Wait is above zero. It returns nil at the turn; when ctx ends first, it
// gives the place back (the turns after it move up) and returns ctx's error. With
// Options.MaxWaiting requests already waiting here, or half of them (at least 1) of d's identity
// (one account, whatever its queues), it gives the place back and returns ErrTooManyWaiting at
// once. A caller that takes a queue's place and then does not want it (a shadow policy serves at
// once) need not call Wait: the place is served at its turn anyway.
func (q *Queue) Wait(ctx context.Context, d ratelimit.Decision) error {
	p := d.Place
	if !d.Allowed || p == nil || d.Wait <= 0 {
		return nil
	}
	start := time.Now() // the timer runs on the real clock, whatever the Limiter decides with
	local := p.Leave != nil
	w := &waiter{queue: queueOf(p.Policy.Name, p.Owner, local), turn: p.Turn, decided: p.Decided, local: local, due: start.Add(d.Wait), moved: make(chan struct{}, 1)}
	if !q.waiters.add(p.Key, p.Owner, w) {
		q.leave(p)
		return ErrTooManyWaiting
	}
	defer q.waiters.remove(p.Key, p.Owner, w)
	for {
		wait := time.Until(q.waiters.dueOf(w))
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
			q.leave(p)
			return ctx.Err()
		}
	}
}

// GiveBack gives back the place of d, an admitted decision whose request will not be served
// after all though its turn came (what it waited for could not be had: the ledger busy with its
// account's other calls, or every in-flight slot of its account held), so that it spent no turn:
// the turns after it move up, as when a waiter leaves. A place already served a pace ago is gone by itself; so is one given back twice.
func (q *Queue) GiveBack(d ratelimit.Decision) {
	if d.Allowed && d.Place != nil {
		q.leave(d.Place)
	}
}

// leave gives p back: in Redis (or in the memory of the fallback that decided it), and the turns
// after it move up, here at once and on the other replicas by the channel.
func (q *Queue) leave(p *ratelimit.Place) {
	if p.Leave != nil {
		turn, moved, now := p.Leave()
		q.waiters.move(p.Key, turn, moved, now, true)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), q.timeout)
	defer cancel()
	var now int64 // 0: the Redis clock
	if q.now != nil {
		now = q.now().UnixMicro()
	}
	c := ratelimit.NewCall(ratelimit.Check{Policy: p.Policy})
	c.ID = p.ID
	c = c.Withdrawal(p.Turn, now)
	vals, err := ratelimit.Script(ratelimit.LeakyBucket).Run(ctx, q.rdb, []string{p.Key}, c.Args()...).Int64Slice()
	if err != nil || len(vals) != 4 {
		return // the place is served at its turn, unused: the queue loses a turn, never admits one more
	}
	turn, moved, at := vals[1], vals[2], vals[3]
	if vals[0] == 0 || moved <= 0 {
		return
	}
	q.waiters.move(p.Key, turn, moved, at, false)
	// The others' waiters; this replica skips its own message (its waiters have moved).
	msg := strings.Join([]string{p.Key, strconv.FormatInt(turn, 10), strconv.FormatInt(moved, 10), strconv.FormatInt(at, 10), q.id}, " ")
	_ = movedScript.Run(ctx, q.rdb, []string{q.channel}, msg).Err() // unheard: see the package documentation
}

// Close ends the subscription and waits for its reader.
func (q *Queue) Close() error {
	if q.sub != nil {
		_ = q.sub.Close()
	}
	q.listening.Wait()
	return nil
}

// moved moves this replica's waiters as a message on the channel says: "key after by at sender",
// the turns of key after `after` given before `at` (Redis µs) move up by `by` µs. A replica's own
// messages are skipped: it moved its waiters when it sent them.
func (q *Queue) moved(msg string) {
	f := strings.Fields(msg)
	if len(f) != 5 || f[4] == q.id {
		return
	}
	after, err1 := strconv.ParseInt(f[1], 10, 64)
	by, err2 := strconv.ParseInt(f[2], 10, 64)
	at, err3 := strconv.ParseInt(f[3], 10, 64)
	if err1 == nil && err2 == nil && err3 == nil {
		q.waiters.move(f[0], after, by, at, false)
	}
}

// waiter is a request held until its turn.
type waiter struct {
	queue   string    // its identity's queue (queueOf), whose next request waits behind it
	owner   string    // the account it counts against (add sets it): one holds at most half the places
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
	// byQueue counts the waiters of each queue (queueOf): a request of a queue with one waits.
	byQueue map[string]int64
	// moves are the recent moves by key, in the order heard, for a waiter decided before one and
	// registered after it (its decision's reply was on its way back): add applies them. Kept a
	// minute, longer than any wait, and the last maxMoves of a key at most.
	moves map[string][]queueMove
}

// queueMove is one leave's move: the turns after `after`, given before `at`, up by `by` µs.
type queueMove struct {
	after, by, at int64
	local         bool
	seen          time.Time
}

// keepMoves is how long a move is kept for the waiters still to register, and maxMoves how many
// of one key's at most: a client that takes places and hangs up by the thousand a second must
// not make every move and every waiter's registration read a list it grows (both under the
// replica's one lock). A waiter registers within its decision's call of being decided, so only
// the moves made meanwhile concern it: hundreds of moves of one key within one call are its own
// account's churn, and a move missed serves its waiter at its old turn (the package's doc).
const (
	keepMoves = time.Minute
	maxMoves  = 256
)

func newWaiters(max int) *waiters {
	return &waiters{max: int64(max), byKey: map[string]map[*waiter]struct{}{}, byOwner: map[string]int64{},
		byQueue: map[string]int64{}, moves: map[string][]queueMove{}}
}

// fullBehind reports whether the replica holds as many waiters as it may, in all or of owner,
// and a waiter of queue, which the queue's next request would wait behind.
func (ws *waiters) fullBehind(queue, owner string) bool {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return ws.byQueue[queue] > 0 && ws.fullLocked(owner)
}

// queueOf names identity's queue of policy among the waiters: Redis's, or, when local, the
// fallback's memory queue.
func queueOf(policy, identity string, local bool) string {
	if local {
		return policy + "\x00" + identity + "\x00local"
	}
	return policy + "\x00" + identity
}

// fullLocked is full with ws.mu held: every place taken, or half of them (at least 1) by owner,
// one account whatever its queues, so that one payroll never takes every place.
func (ws *waiters) fullLocked(owner string) bool {
	return ws.count.Load() >= ws.max || ws.halfLocked(owner)
}

// halfLocked says owner holds its half of the places (at least 1); ws.mu is held.
func (ws *waiters) halfLocked(owner string) bool { return ws.byOwner[owner] >= max(1, ws.max/2) }

// soonest is the time until owner's request finds room here: until the first of this replica's
// waiters is served, or, while owner holds its half of the places, the first of its own (another
// account's turn frees no place of its half). A pace when none waits (a race: the waiters left
// meanwhile).
func (ws *waiters) soonest(now time.Time, pace time.Duration, owner string) time.Duration {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	own := ws.halfLocked(owner)
	soonest := time.Duration(-1)
	for _, k := range ws.byKey {
		for w := range k {
			if due := max(w.due.Sub(now), time.Millisecond); (!own || w.owner == owner) && (soonest < 0 || due < soonest) {
				soonest = due
			}
		}
	}
	if soonest < 0 {
		return pace
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
	w.owner = owner
	ws.count.Add(1)
	ws.byOwner[owner]++
	ws.byQueue[w.queue]++
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
	if ws.byQueue[w.queue]--; ws.byQueue[w.queue] <= 0 {
		delete(ws.byQueue, w.queue)
	}
	ws.count.Add(-1)
	ws.mu.Unlock()
}

// move moves the waiters on key whose turn is after `after`, given before the leave made at `at`,
// up by `by` µs: those of the Redis queue, or with local those of a fallback's memory (their times are
// on the replica's clock). A turn given at or after the leave was counted from the moved queue
// already (in the same microsecond: not moved, so never early). The move is kept for the waiters
// decided before it that have yet to register.
func (ws *waiters) move(key string, after, by, at int64, local bool) {
	if by <= 0 {
		return
	}
	now := time.Now()
	m := queueMove{after: after, by: by, at: at, local: local, seen: now}
	ws.mu.Lock()
	defer ws.mu.Unlock()
	for w := range ws.byKey[key] {
		m.apply(w)
	}
	kept := ws.moves[key]
	old := 0 // the moves are in the order heard: the old ones first
	for old < len(kept) && (now.Sub(kept[old].seen) >= keepMoves || len(kept)-old >= maxMoves) {
		old++
	}
	kept = kept[:copy(kept, kept[old:])]
	ws.moves[key] = append(kept, m)
	if len(ws.moves) > 1000 { // many keys: drop those with no recent move
		for k, ms := range ws.moves {
			if now.Sub(ms[len(ms)-1].seen) >= keepMoves {
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
