// Package batch sends a Limiter's decisions to Redis in batches under load: a Runner around
// ratelimit.Scripts.
//
// What it buys: under concurrency, one script call carries many decisions, so Redis runs one
// EVALSHA (and the replica one round trip) for a batch instead of one per decision: more
// decisions per Redis core and per connection (docs/benchmarks.md). What it costs: a decision
// that finds two calls of its algorithm already on their way waits for one of them to return
// before it is sent (within its own budget); a batch's script holds the algorithm once more,
// looped over its members (batch/*.lua); and a Redis Cluster cannot use it, since one script
// touches one slot and a batch of many keys spans many.
//
// A batch decides exactly as its members sent one by one in that order would
// (TestBatchesDecideAsOneByOne): the algorithm is the core's, only the loop is new.
package batch

import (
	"context"
	"embed"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pixlimit/pixlimit/internal/ratelimit"
)

// Each algorithm's batch script: its decision, generated from the core's parts with
// lua/batch.lua's loop around it (internal/ratelimit/scripts_test.go writes them).
//
//go:embed *.lua
var files embed.FS

// Runner is a ratelimit.Runner that batches each algorithm's decisions. Calls it does not batch
// (a lone decision, and any call while few are in flight) go to the Runner it wraps.
type Runner struct {
	next     ratelimit.Runner
	batchers map[ratelimit.Algorithm]*batcher
}

// New returns a Runner that sends decisions to rdb in batches of at most max, and each lone one
// through next (ratelimit.Scripts(rdb)). max below 2 batches nothing: New returns next itself.
func New(rdb redis.Scripter, next ratelimit.Runner, max int) ratelimit.Runner {
	if max < 2 {
		return next
	}
	r := &Runner{next: next, batchers: make(map[ratelimit.Algorithm]*batcher)}
	for _, a := range ratelimit.Algorithms() {
		src, err := files.ReadFile(string(a) + ".lua")
		if err != nil {
			panic("batch: no script for " + string(a))
		}
		r.batchers[a] = &batcher{rdb: rdb, next: next, a: a, max: max, script: redis.NewScript(string(src))}
	}
	return r
}

// Run decides c over keys, alone or in a batch with the algorithm's other decisions.
func (r *Runner) Run(ctx context.Context, a ratelimit.Algorithm, keys []string, c ratelimit.Call) (ratelimit.Reply, error) {
	return r.batchers[a].decide(ctx, keys, c)
}

// Load loads every batch script into Redis (package warm loads the algorithms'), so that the
// first batches under a burst send only their scripts' hashes.
func (r *Runner) Load(ctx context.Context) error {
	for _, b := range r.batchers {
		if err := b.script.Load(ctx, b.rdb).Err(); err != nil {
			return fmt.Errorf("batch: load scripts: %w", err)
		}
	}
	return nil
}

// batcher sends one algorithm's decisions to Redis in batches, by group commit: a decision that
// arrives while maxInFlight calls are already on their way waits in the queue, and the next call
// takes everything queued, up to max, decided one after another in arrival order inside one
// script (batch.lua). There is no timer: a lone decision is sent at once, alone, and under load
// the batches grow by themselves. A batch decides exactly as its members sent one by one in that
// order would; what a member pays is a share of a round trip, and at most the wait for a call in
// flight, within its own budget.
type batcher struct {
	rdb    redis.Scripter
	next   ratelimit.Runner
	a      ratelimit.Algorithm
	max    int
	script *redis.Script

	mu       sync.Mutex
	queue    []*pending
	inFlight int

	// sent, when set (tests only), learns the size of every batch sent.
	sent func(n int)
}

// maxInFlight is how many batch calls of one algorithm a Runner has on their way at once.
const maxInFlight = 2

// pending is one decision waiting for, or in, a batch.
type pending struct {
	ctx   context.Context
	keys  []string
	c     ratelimit.Call
	state atomic.Int32 // waiting, sent or abandoned
	done  chan batchResult
}

const (
	waiting int32 = iota
	sent
	abandoned
)

type batchResult struct {
	r   ratelimit.Reply
	err error
}

// decide sends one decision at once, alone, when fewer than maxInFlight calls are on their way
// and nothing waits; else it queues it and waits for its reply, or for its own deadline: a
// decision abandoned in the queue is never sent (ErrNotSent); one whose batch is on its way when
// its budget runs out is answered unavailable then, as a lone call that timed out is, and may
// still be decided (package withdraw takes a late sliding-log admission back).
func (b *batcher) decide(ctx context.Context, keys []string, c ratelimit.Call) (ratelimit.Reply, error) {
	b.mu.Lock()
	if b.inFlight < maxInFlight && len(b.queue) == 0 {
		b.inFlight++
		b.mu.Unlock()
		defer func() { // its place given back however the call ends, a panic's too
			b.mu.Lock()
			b.inFlight--
			b.startFlushLocked()
			b.mu.Unlock()
		}()
		return b.next.Run(ctx, b.a, keys, c)
	}
	p := &pending{ctx: ctx, keys: keys, c: c, done: make(chan batchResult, 1)}
	b.queue = append(b.queue, p)
	b.startFlushLocked()
	b.mu.Unlock()
	select {
	case res := <-p.done:
		return res.r, res.err
	case <-ctx.Done():
		if p.state.CompareAndSwap(waiting, abandoned) || p.state.Load() == abandoned { // by flush, which answers it
			// Not ctx.Err(): it was never sent (ErrNotSent), so there is no late decision to withdraw.
			return ratelimit.Reply{}, notSent
		}
		select {
		case res := <-p.done: // its reply came as its budget ran out
			return res.r, res.err
		default:
		}
		return ratelimit.Reply{}, fmt.Errorf("%w: its batch was on its way when its budget ran out: %w", ratelimit.ErrUnavailable, ctx.Err())
	}
}

// notSent answers a decision whose budget ran out in the queue, before any batch took it.
var notSent = fmt.Errorf("%w: %w: its budget ran out while it waited for a batch", ratelimit.ErrUnavailable, ratelimit.ErrNotSent)

// startFlushLocked starts a flush when decisions wait and a call may go; b.mu is held.
func (b *batcher) startFlushLocked() {
	if len(b.queue) > 0 && b.inFlight < maxInFlight {
		b.inFlight++
		go b.flush()
	}
}

// flush sends batches while decisions are queued, then gives its place in flight back.
func (b *batcher) flush() {
	for {
		b.mu.Lock()
		var batch []*pending
		for len(b.queue) > 0 && len(batch) < b.max {
			p := b.queue[0]
			b.queue[0] = nil
			b.queue = b.queue[1:]
			switch {
			case p.ctx.Err() != nil: // its budget ran out in the queue, its waiter not yet told
				if p.state.CompareAndSwap(waiting, abandoned) {
					p.done <- batchResult{err: notSent}
				}
			case p.state.CompareAndSwap(waiting, sent):
				batch = append(batch, p)
			}
		}
		if len(batch) == 0 {
			b.inFlight--
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
		b.send(batch)
	}
}

// send runs one batch, under the latest of its members' deadlines, and delivers each reply. A
// member's nearer deadline does not cut the others' budgets short (a member with 5 ms left made a
// batch of 32 fail under a Redis 30 ms slow): its own wait ends at its own deadline (decide). A
// batch of one runs the algorithm's own script. (A member without a deadline, which a Limiter
// never sends, waits as long as the batch.)
func (b *batcher) send(batch []*pending) {
	deadline := time.Time{}
	for _, p := range batch {
		if d, ok := p.ctx.Deadline(); ok && d.After(deadline) {
			deadline = d
		}
	}
	ctx, cancel := context.Background(), context.CancelFunc(func() {})
	if !deadline.IsZero() {
		ctx, cancel = context.WithDeadline(ctx, deadline)
	}
	defer cancel()
	if b.sent != nil {
		b.sent(len(batch))
	}
	if len(batch) == 1 {
		r, err := b.next.Run(ctx, b.a, batch[0].keys, batch[0].c)
		batch[0].done <- batchResult{r, err}
		return
	}
	keys, args := batchArgs(batch)
	vals, err := b.script.Run(ctx, b.rdb, keys, args...).Int64Slice()
	want := 0
	queued := b.a == ratelimit.LeakyBucket
	for _, p := range batch {
		want += ratelimit.ReplySize(len(p.keys), queued)
	}
	if err == nil && len(vals) != want {
		err = fmt.Errorf("batch of %d returned %d values, want %d", len(batch), len(vals), want)
	}
	for _, p := range batch {
		if err != nil {
			p.done <- batchResult{err: fmt.Errorf("%w: %w", ratelimit.ErrUnavailable, err)}
			continue
		}
		m := ratelimit.ReplySize(len(p.keys), queued)
		r, rerr := ratelimit.ParseReply(vals[:m:m], len(p.keys), queued)
		vals = vals[m:]
		p.done <- batchResult{r, rerr}
	}
}

// batchArgs are a batch's keys and arguments, as batch.lua reads them: how many decisions, how
// many key settings (limit, window, burst), each decision's number of keys, id, now, operation and,
// per key, the index of its setting, then the settings, each once. Sized in one pass: a batch
// under load is built thousands of times a second.
func batchArgs(batch []*pending) (keys []string, args []any) {
	nkeys := 0
	for _, p := range batch {
		nkeys += len(p.keys)
	}
	keys = make([]string, 0, nkeys)
	args = make([]any, 2, 2+4*len(batch)+nkeys+3*nkeys) // at most one setting per key
	var seen [4][3]any
	settings := seen[:0]
	for _, p := range batch {
		keys = append(keys, p.keys...)
		args = append(args, len(p.keys), p.c.ID, p.c.NowArg(), p.c.Op.Arg())
		for _, k := range p.c.Settings {
			j := slices.Index(settings, k)
			if j < 0 {
				j = len(settings)
				settings = append(settings, k)
			}
			args = append(args, j+1)
		}
	}
	args[0], args[1] = len(batch), len(settings)
	for _, s := range settings {
		args = append(args, s[0], s[1], s[2])
	}
	return keys, args
}
