package ratelimit

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// batcher sends one algorithm's decisions to Redis in batches, by group commit: a decision that
// arrives while maxInFlight calls are already on their way waits in the queue, and the next call
// takes everything queued, up to max, decided one after another in arrival order inside one
// script (batch.lua). There is no timer: a lone decision is sent at once, alone, and under load
// the batches grow by themselves. A batch decides exactly as its members sent one by one in that
// order would; what a member pays is a share of a round trip, and at most the wait for a call in
// flight, within its own budget.
//
// A Redis Cluster gets no batcher: one script touches one slot, and a batch of many keys spans
// many (see Options.BatchMax).
type batcher struct {
	l   *Limiter
	a   Algorithm
	max int

	mu       sync.Mutex
	queue    []*pending
	inFlight int

	// sent, when set (tests only), learns the size of every batch sent.
	sent func(n int)
}

// maxInFlight is how many batch calls of one algorithm a Limiter has on their way at once.
const maxInFlight = 2

// pending is one decision waiting for, or in, a batch.
type pending struct {
	ctx   context.Context
	keys  []string
	c     call
	state atomic.Int32 // waiting, sent or abandoned
	done  chan batchResult
}

const (
	waiting int32 = iota
	sent
	abandoned
)

type batchResult struct {
	r   reply
	err error
}

// decide sends one decision at once, alone, when fewer than maxInFlight calls are on their way
// and nothing waits; else it queues it and waits for its reply, or for its own deadline while it
// waits in the queue: a decision abandoned there is never sent. Once sent, its call's deadline
// is the earliest of its members', so the wait ends within this decision's budget too.
func (b *batcher) decide(ctx context.Context, keys []string, c call) (reply, error) {
	b.mu.Lock()
	if b.inFlight < maxInFlight && len(b.queue) == 0 {
		b.inFlight++
		b.mu.Unlock()
		r, err := run(ctx, b.l.rdb, b.a, keys, c)
		b.mu.Lock()
		b.inFlight--
		b.startFlushLocked()
		b.mu.Unlock()
		return r, err
	}
	p := &pending{ctx: ctx, keys: keys, c: c, done: make(chan batchResult, 1)}
	b.queue = append(b.queue, p)
	b.startFlushLocked()
	b.mu.Unlock()
	select {
	case res := <-p.done:
		return res.r, res.err
	case <-ctx.Done():
		if p.state.CompareAndSwap(waiting, abandoned) {
			// Not ctx.Err(): it was never sent, so there is no late decision to withdraw.
			return reply{}, fmt.Errorf("%w: its budget ran out while it waited for a batch", ErrUnavailable)
		}
		res := <-p.done // sent: its call ends by this decision's deadline
		return res.r, res.err
	}
}

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
			if p.state.CompareAndSwap(waiting, sent) {
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

// send runs one batch, under the earliest of its members' deadlines, and delivers each reply. A
// batch of one runs the algorithm's own script.
func (b *batcher) send(batch []*pending) {
	deadline := time.Time{}
	for _, p := range batch {
		if d, ok := p.ctx.Deadline(); ok && (deadline.IsZero() || d.Before(deadline)) {
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
		r, err := run(ctx, b.l.rdb, b.a, batch[0].keys, batch[0].c)
		batch[0].done <- batchResult{r, err}
		return
	}
	keys, args := batchArgs(batch)
	vals, err := batchScripts[b.a].Run(ctx, b.l.rdb, keys, args...).Int64Slice()
	want := 0
	queued := b.a == LeakyBucket
	for _, p := range batch {
		want += replySize(len(p.keys), queued)
	}
	if err == nil && len(vals) != want {
		err = fmt.Errorf("batch of %d returned %d values, want %d", len(batch), len(vals), want)
	}
	for _, p := range batch {
		if err != nil {
			p.done <- batchResult{err: fmt.Errorf("%w: %w", ErrUnavailable, err)}
			continue
		}
		m := replySize(len(p.keys), queued)
		r, rerr := parseReply(vals[:m:m], len(p.keys), queued)
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
		args = append(args, len(p.keys), p.c.id, p.c.nowArg(), p.c.op.arg())
		for _, k := range p.c.keys {
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

// newBatchers makes one batcher per algorithm, or none when max is below 2.
func newBatchers(l *Limiter, max int) map[Algorithm]*batcher {
	if max < 2 {
		return nil
	}
	bs := make(map[Algorithm]*batcher, len(scripts))
	for a := range scripts {
		bs[a] = &batcher{l: l, a: a, max: max}
	}
	return bs
}
