// Package withdraw takes back what a decision recorded but its caller was told it did not get: a
// Runner around the core's (ratelimit.Scripts, or package batch's), and its Sequences around a
// sequence runner (package sequence's) for the steps a Decide sends in one call.
//
// What it buys: two honest answers at the edges of a script. A decision that came back too late
// (its caller was answered by the fail mode) may still have run in Redis and recorded an
// admission: with the sliding log, whose entries carry the request's id, it is withdrawn, so a
// Redis that stalls consumes no quota for requests it never answered in time. And on a Redis
// Cluster, where a decision's keys live on different nodes and one script cannot see them all
// (CROSSSLOT), each key is decided by its own script (Options.Split), and the admissions of a
// decision that another key refused, or that failed, are withdrawn.
//
// What it costs: between a split key's admission and its withdrawal (about a round trip; more
// while Redis is slow) a refused request holds a place in that key, so a concurrent request can
// be refused that one script would have admitted: the error is on the strict side only, never
// an admission past the limit. A split decision costs a script per key; and the withdrawals wait
// in memory (bounded) while Redis does not answer, given up past the bound and at Close (Lost):
// what is lost stays counted until it leaves its window.
//
// A withdrawal is run in the background, by a few workers, from one queue ordered by when each
// is due. An attempt Redis does not answer is tried again, backing off to once a second, until
// Redis answers or the admission has left its window by itself: a withdrawal is never dropped
// because Redis is slow or down, or because many wait. Only the sorted-set log's withdrawal is
// both idempotent and made here (it removes the request's own entry by its id). The counters give
// one unit back, and an attempt that timed out may have run: trying again could give back twice
// and admit past the limit. Such an attempt is given up and counted as lost instead; an attempt
// Redis refused to run (a refused connection, a Redis error) is tried again. The queue's place
// (leaky_bucket) is a request's own entry too, but its withdrawal moves the turns after it up,
// which the other replicas' waiters learn only from package queue's message: a late one is left
// to be served, unused, at its turn (the queue loses a turn, never admits one more), as a leave
// Redis does not answer is (Queue.Wait).
package withdraw

import (
	"cmp"
	"container/heap"
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pixlimit/pixlimit/internal/ratelimit"
)

// Options configure a Runner.
type Options struct {
	// Split decides each key of a decision by its own script and withdraws the admissions of a
	// decision that another key refused or that failed: what a Redis Cluster needs, whose keys
	// of one decision may live on different nodes.
	Split bool
	// Timeout is a withdrawal attempt's budget: the Limiter's (ratelimit.Options.Timeout).
	// Default 100ms.
	Timeout time.Duration
	// Logger receives the losses, at most one report per LogEvery. Default slog.Default(); 10s.
	Logger   *slog.Logger
	LogEvery time.Duration
	// Withdrawn, when set, learns how long each split admission was held before its withdrawal
	// (tests measure the window of imprecision with it).
	Withdrawn func(held time.Duration)
}

// Runner is a ratelimit.Runner that withdraws what its decisions' callers did not get.
type Runner struct {
	rdb  redis.Scripter
	next ratelimit.Runner
	opts Options
	q    *withdrawQueue
	// pending counts the withdrawals not yet settled, for Close (and tests) to wait on.
	pending sync.WaitGroup
	// lost counts the withdrawals given up.
	lost atomic.Int64
	// closing is closed by Close: withdrawals stop waiting between attempts.
	closing   chan struct{}
	closeOnce sync.Once
}

// New returns a Runner that decides through next and withdraws on rdb.
func New(rdb redis.Scripter, next ratelimit.Runner, opts Options) *Runner {
	opts.Timeout = cmp.Or(opts.Timeout, 100*time.Millisecond)
	opts.Logger = cmp.Or(opts.Logger, slog.Default())
	opts.LogEvery = cmp.Or(opts.LogEvery, 10*time.Second)
	return &Runner{rdb: rdb, next: next, opts: opts, q: newWithdrawQueue(), closing: make(chan struct{})}
}

// Run decides c over keys through the next Runner (each key apart, with Split), and queues the
// withdrawal of whatever the caller is told it did not get.
func (r *Runner) Run(ctx context.Context, a ratelimit.Algorithm, keys []string, c ratelimit.Call) (ratelimit.Reply, error) {
	if r.opts.Split && len(keys) > 1 {
		return r.split(ctx, a, keys, c)
	}
	reply, err := r.next.Run(ctx, a, keys, c)
	if err != nil {
		r.refreshTopology()
		r.WithdrawLate(a, keys, c, err)
	}
	return reply, err
}

// Lost is how many admissions of refused or failed decisions could not be taken back: each stays
// counted until it leaves its window.
func (r *Runner) Lost() int64 { return r.lost.Load() }

// A withdrawal takes back one admission in one key.
type withdrawal struct {
	a       ratelimit.Algorithm
	key     string
	c       ratelimit.Call // the decision's call for this one key
	at      int64          // the admission's time in µs (the decision's now); 0 for a late decision
	late    bool           // the decision came back too late: Redis may have recorded it, or never will
	decided time.Time      // when the caller was answered
	expires time.Time      // the admission has left its window by then: nothing is left to take back
	due     time.Time      // the next attempt
	tries   int            // attempts Redis did not answer
	misses  int            // late: attempts Redis answered without finding the request
	size    int            // what it holds in memory, roughly
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

// withdraw queues the withdrawal of one admission, made at `at` (µs, its decision's now) in key:
// a split decision's admission in a key whose sibling refused or failed.
func (r *Runner) withdraw(a ratelimit.Algorithm, key string, c ratelimit.Call, at int64, decided time.Time) {
	r.enqueue(&withdrawal{a: a, key: key, c: c, at: at, decided: decided, expires: time.Now().Add(window(c))})
}

// WithdrawLate queues the withdrawal of a request whose decision did not come back within the
// budget (c and keys are the decision's; cause, why). The caller answered it as unavailable, yet
// Redis may still have run the script, then or later, and recorded it. With the sliding log each
// attempt removes the request's own entry by its id: exact, and harmless if the script refused it
// or never ran. The counters keep counts, not requests, and cannot tell whether this request was
// counted, so giving one back could admit past the limit: their late admissions stay counted
// until they leave the window, the strict side (a queue's, until its turn: the package's doc). Run calls it for its own calls, and
// Sequences for a sequence's.
func (r *Runner) WithdrawLate(a ratelimit.Algorithm, keys []string, c ratelimit.Call, cause error) {
	if a != ratelimit.SlidingLog || !c.Op.Takes() || !ratelimit.MayHaveRun(cause) {
		return
	}
	now := time.Now()
	for i, key := range keys { // one key per call: on a cluster they live apart
		one := c.Only(i)
		r.enqueue(&withdrawal{a: a, key: key, c: one, late: true, decided: now, expires: now.Add(window(one))})
	}
}

// Sequences is next, the Limiter's Options.Sequences (package sequence's), whose calls that
// failed unavailable, their scripts perhaps run, have their steps' admissions withdrawn late as
// Run's own are (WithdrawLate: a layer's step, a slot or a voucher, is no algorithm, and keeps
// its own lease).
func (r *Runner) Sequences(next ratelimit.SequenceRunner) ratelimit.SequenceRunner {
	if next == nil {
		return nil // no sequences: each step is a call of its own, by Run
	}
	return sequences{r, next}
}

type sequences struct {
	r    *Runner
	next ratelimit.SequenceRunner
}

func (s sequences) RunSequence(ctx context.Context, steps []ratelimit.StepCall) ([]ratelimit.Reply, error) {
	replies, err := s.next.RunSequence(ctx, steps)
	if errors.Is(err, ratelimit.ErrUnavailable) { // else it was never sent
		for _, st := range steps { // an algorithm's step names its body after it (ratelimit.StepScript)
			s.r.WithdrawLate(ratelimit.Algorithm(st.Body), st.Keys, st.Call, err)
		}
	}
	return replies, err
}

// window is the window of a one-key call's policy, from its settings (limit, window in ms,
// capacity).
func window(c ratelimit.Call) time.Duration {
	ms, _ := c.Settings[0][1].(int64)
	return time.Duration(ms) * time.Millisecond
}

// enqueue adds w to the queue, due now, and starts a worker if fewer than withdrawWorkers run.
// One that comes once Close has begun (a late decision of a request still running) is lost at
// once: Close's wait for the pending ones has begun, and may not be joined (sync.WaitGroup).
func (r *Runner) enqueue(w *withdrawal) {
	w.size = withdrawalOverhead + len(w.key)
	w.size += len(w.c.ID)
	w.due = time.Now()
	q := r.q
	q.mu.Lock()
	closed := !q.closedAt.IsZero()
	if !closed {
		r.pending.Add(1) // under q.mu, which Close takes before its wait
	}
	if closed || q.bytes+w.size > maxWithdrawalBytes {
		q.mu.Unlock()
		if closed {
			r.count(w, errors.New("the runner is closed"))
			return
		}
		r.lose(w, errors.New("too many withdrawals waiting"))
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
		go r.withdrawWorker()
	} else {
		select {
		case q.wake <- struct{}{}:
		default:
		}
	}
}

// requeue puts w back, due after wait: its memory counts again until it is popped.
func (r *Runner) requeue(w *withdrawal, wait time.Duration) {
	w.due = time.Now().Add(wait)
	q := r.q
	q.mu.Lock()
	heap.Push(&q.items, w)
	q.bytes += w.size
	q.mu.Unlock()
}

// withdrawWorker runs the withdrawals as they fall due, until none waits.
func (r *Runner) withdrawWorker() {
	q := r.q
	for {
		q.mu.Lock()
		if len(q.items) == 0 {
			q.workers--
			q.mu.Unlock()
			return
		}
		w := q.items[0]
		closing, drained := r.isClosing(), !q.closedAt.IsZero() && time.Since(q.closedAt) > r.closeDrain()
		wait, full := time.Until(w.due), q.inflight >= q.allowed && !drained
		if full {
			wait = max(wait, backoff(1)) // Redis is not answering: let the attempts under way end first
		}
		if wait > 0 && !closing || full {
			q.mu.Unlock()
			closed := r.closing // after Close, what waits is tried at once: shutdown waits no backoff
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
			r.lose(w, errors.New("the limiter closed"))
			continue
		}
		q.inflight++
		q.mu.Unlock()
		answered := r.attempt(w, closing)
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
func (r *Runner) attempt(w *withdrawal, closing bool) (answered bool) {
	if !time.Now().Before(w.expires) { // it left its window by itself
		r.pending.Done()
		return true
	}
	removed, err := r.run(w)
	answered = err == nil
	switch {
	case err == nil && w.late && removed == 0 && w.misses < len(lateRetries) && !closing:
		w.misses++
		r.requeue(w, lateRetries[w.misses-1]) // Redis may not have run the late script yet
	case err == nil:
		if w.late && removed > 0 {
			r.opts.Logger.Debug("rate limiter withdrew a late decision")
		}
		if !w.late && r.opts.Withdrawn != nil {
			r.opts.Withdrawn(time.Since(w.decided))
		}
		r.pending.Done()
	case w.late && closing:
		r.opts.Logger.Warn("rate limiter could not withdraw a late decision; it may stay counted until its window passes",
			"cause", err.Error())
		r.pending.Done()
	case closing || w.a != ratelimit.SlidingLog && ratelimit.MayHaveRun(err):
		r.lose(w, err) // not idempotent: trying again after a timeout could give back twice
	default:
		w.tries++
		r.requeue(w, backoff(w.tries))
	}
	return answered
}

// lose gives up w: counted, and logged at most once per Options.LogEvery with how many were lost.
func (r *Runner) lose(w *withdrawal, cause error) {
	defer r.pending.Done()
	r.count(w, cause)
}

// count counts w lost, and logs it (at most once per LogEvery).
func (r *Runner) count(w *withdrawal, cause error) {
	if w.late { // it may never have been recorded: nothing known to be lost
		return
	}
	total := r.lost.Add(1)
	q := r.q
	now := time.Now()
	q.mu.Lock()
	q.lostSince++
	if !q.loggedAt.IsZero() && now.Sub(q.loggedAt) < r.opts.LogEvery {
		q.mu.Unlock()
		return
	}
	n := q.lostSince
	q.lostSince, q.loggedAt = 0, now
	q.mu.Unlock()
	r.opts.Logger.Warn("rate limiter could not withdraw admissions; each stays counted until its window passes",
		"lost", n, "lost_total", total, "algorithm", w.a, "cause", cause.Error())
}

func (r *Runner) isClosing() bool {
	select {
	case <-r.closing:
		return true
	default:
		return false
	}
}

// closeDrain is how long Close keeps trying: a few budgets, at least closeDrain.
func (r *Runner) closeDrain() time.Duration { return max(closeDrain, 5*r.opts.Timeout) }

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

// run runs w's withdrawal once, within the budget, and returns how many keys it took something
// back from. Its time is the decision's when the decision's was injected (tests), else Redis's.
func (r *Runner) run(w *withdrawal) (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), r.opts.Timeout)
	defer cancel()
	return ratelimit.Script(w.a).Run(ctx, r.rdb, []string{w.key}, w.c.Withdrawal(w.at, w.c.Now).Args()...).Int64()
}

// Close gives the waiting withdrawals one more attempt each, at once rather than over their
// backoff, for a drain of a few budgets (at least a second; what still waits then is counted
// lost), and returns when none waits. Close the Limiter first: it makes no more decisions.
func (r *Runner) Close() error {
	r.closeOnce.Do(func() {
		r.q.mu.Lock()
		r.q.closedAt = time.Now()
		r.q.mu.Unlock()
		close(r.closing)
	})
	r.pending.Wait()
	return nil
}
