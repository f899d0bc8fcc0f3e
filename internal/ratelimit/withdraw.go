package ratelimit

import (
	"container/heap"
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// A withdrawal takes back, in the background, what a decision recorded but the caller was told
// it did not get: an admission in a key whose sibling refused or failed on a cluster (decideApart),
// or a decision that came back too late (withdrawLate). Withdrawals wait in one queue per Limiter,
// ordered by when each is due, and a few workers, started when there is work and gone when there
// is none, run them. An attempt Redis does not answer is tried again, backing off to once a
// second, until Redis answers or the admission has left its window by itself: a withdrawal is
// never dropped because Redis is slow or down, or because many wait. What waits is bounded by
// memory (maxWithdrawalBytes): past it, and at Close after a short drain, a withdrawal is given up,
// counted in Stats.WithdrawalsLost and logged. A lost admission stays counted until it leaves its
// window: stricter, never looser.
//
// Only the sorted-set log's withdrawal is idempotent (it removes the request's own entry by its
// id). The others give one unit back, and an attempt that timed out may have run: trying again
// could give back twice and admit past the limit. Such an attempt is given up and counted as lost
// instead; an attempt Redis refused to run (a refused connection, a Redis error) is tried again.
type withdrawal struct {
	a       Algorithm
	key     string
	c       Call      // the decision's call for this one key
	at      int64     // the admission's time in µs (the decision's now); 0 for a late decision
	late    bool      // the decision came back too late: Redis may have recorded it, or never will
	decided time.Time // when the caller was answered
	expires time.Time // the admission has left its window by then: nothing is left to take back
	due     time.Time // the next attempt
	tries   int       // attempts Redis did not answer
	misses  int       // late: attempts Redis answered without finding the request
	size    int       // what it holds in memory, roughly
}

// Withdrawal tuning.
const (
	// withdrawWorkers is the most attempts in flight at once, each on a connection of the pool:
	// as many as a busy replica's split refusals need to be withdrawn within a round trip or two
	// (with 8, TestClusterExactness's refused pairs held their place for a p50 of 0.76 s). While
	// Redis does not answer, fewer: each failed attempt halves the attempts allowed in flight,
	// down to withdrawFloor, and each answered one doubles it back, so that withdrawals waiting
	// out a slow Redis never hold the connections the decisions need.
	withdrawWorkers = 64
	withdrawFloor   = 2
	// maxWithdrawalBytes bounds the memory of the waiting withdrawals (about 200,000 of them): an
	// outage of a minute at thousands of split refusals a second fits.
	maxWithdrawalBytes = 64 << 20
	// withdrawalOverhead is a withdrawal's memory beside its key and id: the struct, its boxed
	// arguments and its place in the heap.
	withdrawalOverhead = 320
	// closeDrain is how long Close keeps trying the waiting withdrawals, at least: past it, each
	// one still waiting is given up at once.
	closeDrain = time.Second
)

// lateRetries are the waits between the answered attempts to withdraw a late decision: its script
// may still be queued behind whatever made Redis slow, and may run after an attempt that found
// nothing, so the attempts spread over a few seconds. After the last one, an admission that
// Redis recorded even later stays counted until it leaves its window.
var lateRetries = [...]time.Duration{100 * time.Millisecond, 500 * time.Millisecond, 2 * time.Second}

// backoff is the wait before the next attempt after tries unanswered ones: 50 ms, doubling, at
// most a second.
func backoff(tries int) time.Duration {
	return min(50*time.Millisecond<<min(tries-1, 5), time.Second)
}

// withdrawQueue holds the waiting withdrawals, earliest due first.
type withdrawQueue struct {
	mu       sync.Mutex
	items    withdrawalHeap
	bytes    int
	workers  int
	inflight int           // attempts under way
	allowed  int           // attempts allowed in flight: withdrawFloor to withdrawWorkers
	wake     chan struct{} // a new withdrawal is due now: a sleeping worker looks again
	// lost, and when it was last logged, for a loss report at most once per outage interval.
	lostSince int
	loggedAt  time.Time
	closedAt  time.Time
}

func newWithdrawQueue() *withdrawQueue {
	return &withdrawQueue{wake: make(chan struct{}, 1), allowed: withdrawWorkers}
}

// withdraw queues the withdrawal of one admission, made at `at` (µs, its decision's now) in key
// under policy p: the cluster path's admission in a key whose sibling refused or failed.
func (l *Limiter) withdraw(a Algorithm, key string, c Call, at int64, p Policy, decided time.Time) {
	l.enqueue(&withdrawal{a: a, key: key, c: c, at: at, decided: decided, expires: l.clock().Add(p.Window)})
}

// withdrawLate queues the withdrawal of a request whose decision did not come back within the
// budget (c and keys are the decision's, checks its policies). The caller answered it as
// unavailable, yet Redis may still have run the script, then or later, and recorded it. With the
// sliding log each attempt removes the request's own entry by its id: exact, and harmless if the
// script refused it or never ran. The other algorithms keep counts, not requests, and cannot tell
// whether this request was counted, so giving one back could admit past the limit: their late
// admissions stay counted until they leave the window, the strict side.
func (l *Limiter) withdrawLate(a Algorithm, keys []string, c Call, checks []Check, cause error) {
	if a != SlidingLog || !c.Op.Takes() || !mayHaveRun(cause) {
		return
	}
	now := l.clock()
	for i, key := range keys { // one key per call: on a cluster they live apart
		l.enqueue(&withdrawal{a: a, key: key, c: c.Only(i), late: true, decided: now, expires: now.Add(checks[i].Policy.Window)})
	}
}

// enqueue adds w to the queue, due now, and starts a worker if fewer than withdrawWorkers run.
func (l *Limiter) enqueue(w *withdrawal) {
	w.size = withdrawalOverhead + len(w.key)
	w.size += len(w.c.ID)
	w.due = time.Now()
	q := l.withdrawQ
	l.withdrawals.Add(1)
	q.mu.Lock()
	if q.bytes+w.size > maxWithdrawalBytes {
		q.mu.Unlock()
		l.lose(w, errors.New("too many withdrawals waiting"))
		return
	}
	heap.Push(&q.items, w)
	q.bytes += w.size
	start := q.workers < withdrawWorkers
	if start {
		q.workers++
	}
	q.mu.Unlock()
	if start {
		go l.withdrawWorker()
	} else {
		select {
		case q.wake <- struct{}{}:
		default:
		}
	}
}

// requeue puts w back, due after wait: its memory counts again until it is popped.
func (l *Limiter) requeue(w *withdrawal, wait time.Duration) {
	w.due = time.Now().Add(wait)
	q := l.withdrawQ
	q.mu.Lock()
	heap.Push(&q.items, w)
	q.bytes += w.size
	q.mu.Unlock()
}

// withdrawWorker runs the withdrawals as they fall due, until none waits.
func (l *Limiter) withdrawWorker() {
	q := l.withdrawQ
	for {
		q.mu.Lock()
		if len(q.items) == 0 {
			q.workers--
			q.mu.Unlock()
			return
		}
		w := q.items[0]
		closing, drained := l.isClosing(), !q.closedAt.IsZero() && time.Since(q.closedAt) > l.closeDrain()
		wait, full := time.Until(w.due), q.inflight >= q.allowed && !drained
		if full {
			wait = max(wait, backoff(1)) // Redis is not answering: let the attempts under way end first
		}
		if wait > 0 && !closing || full {
			q.mu.Unlock()
			closed := l.closing // after Close, what waits is tried at once: shutdown waits no backoff
			if closing {
				closed = nil // already closing: only an attempt's end or the timer wakes a full queue
			}
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-q.wake:
			case <-closed:
			}
			t.Stop()
			continue
		}
		heap.Pop(&q.items)
		q.bytes -= w.size
		if drained {
			q.mu.Unlock()
			l.lose(w, errors.New("the limiter closed"))
			continue
		}
		q.inflight++
		q.mu.Unlock()
		answered := l.attempt(w, closing)
		q.mu.Lock()
		q.inflight--
		if answered {
			q.allowed = min(2*q.allowed, withdrawWorkers)
		} else {
			q.allowed = max(q.allowed/2, withdrawFloor)
		}
		q.mu.Unlock()
		select { // a worker waiting for an attempt to end looks again
		case q.wake <- struct{}{}:
		default:
		}
	}
}

// attempt runs w once and settles it, or queues it again; it reports whether Redis answered.
func (l *Limiter) attempt(w *withdrawal, closing bool) (answered bool) {
	if !l.clock().Before(w.expires) { // it left its window by itself
		l.withdrawals.Done()
		return true
	}
	removed, err := l.runWithdrawal(w.a, w.key, w.c.Withdrawal(w.at, l.clockArg()))
	answered = err == nil
	switch {
	case err == nil && w.late && removed == 0 && w.misses < len(lateRetries) && !closing:
		w.misses++
		l.requeue(w, lateRetries[w.misses-1]) // Redis may not have run the late script yet
	case err == nil:
		if w.late && removed > 0 {
			l.logger.Debug("rate limiter withdrew a late decision")
		}
		if !w.late && l.withdrawn != nil {
			l.withdrawn(time.Since(w.decided))
		}
		l.withdrawals.Done()
	case w.late && closing:
		l.logger.Warn("rate limiter could not withdraw a late decision; it may stay counted until its window passes",
			"cause", err.Error())
		l.withdrawals.Done()
	case closing || w.a != SlidingLog && mayHaveRun(err):
		l.lose(w, err) // not idempotent: trying again after a timeout could give back twice
	default:
		w.tries++
		l.requeue(w, backoff(w.tries))
	}
	return answered
}

// lose gives up w: counted, and logged at most once per OutageLogEvery with how many were lost.
func (l *Limiter) lose(w *withdrawal, cause error) {
	defer l.withdrawals.Done()
	if w.late { // it may never have been recorded: nothing known to be lost
		return
	}
	total := l.stats.withdrawalsLost.Add(1)
	q := l.withdrawQ
	now := time.Now()
	q.mu.Lock()
	q.lostSince++
	if !q.loggedAt.IsZero() && now.Sub(q.loggedAt) < l.outages.every {
		q.mu.Unlock()
		return
	}
	n := q.lostSince
	q.lostSince, q.loggedAt = 0, now
	q.mu.Unlock()
	l.logger.Warn("rate limiter could not withdraw admissions; each stays counted until its window passes",
		"lost", n, "lost_total", total, "algorithm", w.a, "cause", cause.Error())
}

func (l *Limiter) isClosing() bool {
	select {
	case <-l.closing:
		return true
	default:
		return false
	}
}

// closeDrain is how long Close keeps trying: a few budgets, at least closeDrain.
func (l *Limiter) closeDrain() time.Duration { return max(closeDrain, 5*l.timeout) }

// withdrawalHeap orders withdrawals by when they are due.
type withdrawalHeap []*withdrawal

func (h withdrawalHeap) Len() int           { return len(h) }
func (h withdrawalHeap) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h withdrawalHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *withdrawalHeap) Push(x any)        { *h = append(*h, x.(*withdrawal)) }
func (h *withdrawalHeap) Pop() any {
	old := *h
	w := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return w
}

// mayHaveRun reports whether a failed call may have run in Redis, then or later: anything but a
// failure that surely sent nothing (a dial that failed, a pool with no connection to give, an open
// breaker) or a
// reply of Redis's own refusing to run it (an error reply: BUSY, LOADING, READONLY, OOM, ...). A
// timeout, a reset or an EOF after the script was sent may have run it.
func mayHaveRun(err error) bool {
	var re redis.Error
	var oe *net.OpError
	switch {
	case errors.As(err, &re) && !errors.Is(err, context.DeadlineExceeded): // Redis answered: it refused
		return false
	case errors.Is(err, redis.ErrPoolTimeout), errors.Is(err, redis.ErrClosed), errors.Is(err, ErrNotSent):
		return false
	case errors.As(err, &oe) && oe.Op == "dial":
		return false
	}
	return true
}

// Close gives the waiting withdrawals one more attempt each, at once rather than over their
// backoff, for closeDrain at most (what still waits then is counted lost), and waits for the
// heartbeat and the subscription's reader. The Limiter must not be used after Close; the Redis client stays the caller's to close.
func (l *Limiter) Close() error {
	l.closeOnce.Do(func() {
		l.withdrawQ.mu.Lock()
		l.withdrawQ.closedAt = time.Now()
		l.withdrawQ.mu.Unlock()
		close(l.closing)
		if l.sub != nil {
			_ = l.sub.Close() // ends listen
		}
	})
	l.withdrawals.Wait()
	l.listening.Wait()
	return nil
}
