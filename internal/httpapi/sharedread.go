package httpapi

import (
	"context"
	"fmt"
	"sync"

	"github.com/pixlimit/pixlimit/internal/pix"
)

// limitsReads reads an account's limits in force for the PUT /v1/limits that settings refused:
// such a PUT still goes through if it only tightens, and that takes a read. A flood of refused
// raises must not become a flood of ledger reads, so the refused PUTs of one account share reads:
// at most one runs per account in a replica, and every caller that arrives while it runs joins
// the next one. A caller never takes an answer read before it arrived, so a lowering made by
// another request that finished first is always seen, and no lowering is refused on a stale
// read. Price: a refused raise waits for up to two reads instead of one.
type limitsReads struct {
	ledger pix.MoneyLimitStore

	mu   sync.Mutex
	runs map[string]*limitsRead // per account: the read running, and the one that will follow it
}

type limitsRead struct {
	done   chan struct{}
	limits pix.MoneyLimits
	err    error
	next   *limitsRead // the read that starts when this one ends, joined by those who came later
	joined int         // how many callers wait for it
}

func newLimitsReads(ledger pix.MoneyLimitStore) *limitsReads {
	return &limitsReads{ledger: ledger, runs: map[string]*limitsRead{}}
}

// Read returns the account's limits as a read that started after the call read them. The read
// is the ledger's, with its own deadline; ctx only bounds how long this caller waits for it.
func (r *limitsReads) Read(ctx context.Context, account string) (pix.MoneyLimits, error) {
	r.mu.Lock()
	read := r.runs[account]
	switch {
	case read == nil:
		read = &limitsRead{done: make(chan struct{})}
		r.runs[account] = read
		go r.run(context.WithoutCancel(ctx), account, read)
	default:
		if read.next == nil {
			read.next = &limitsRead{done: make(chan struct{})}
		}
		read = read.next
	}
	read.joined++
	r.mu.Unlock()
	select {
	case <-read.done:
		return read.limits, read.err
	case <-ctx.Done():
		return pix.MoneyLimits{}, ctx.Err()
	}
}

// run reads for read, then for the reads queued behind it, one after the other.
func (r *limitsReads) run(ctx context.Context, account string, read *limitsRead) {
	for read != nil {
		read.limits, read.err = r.readOnce(ctx, account)
		r.mu.Lock()
		next := read.next
		if next == nil {
			delete(r.runs, account)
		} else {
			r.runs[account] = next
		}
		r.mu.Unlock()
		close(read.done)
		read = next
	}
}

// readOnce is one ledger read; a panic in it is an error for its callers, since no request's
// recovery reaches this goroutine.
func (r *limitsReads) readOnce(ctx context.Context, account string) (l pix.MoneyLimits, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("httpapi: reading the limits in force: panic: %v", p)
		}
	}()
	return r.ledger.Limits(ctx, account)
}
