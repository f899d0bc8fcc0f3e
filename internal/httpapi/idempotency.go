package httpapi

import (
	"context"
	"sync"
	"time"
)

// originals lets one PIX per account and Idempotency-Key be in progress on this replica: the
// first to arrive is the original; the others wait, making no limiter or ledger call, until it
// has been answered, then are decided and answered one at a time: each its replay (the same
// body) or 409 idempotency_conflict (another), which the ledger then answers from its record at
// once. If the original recorded nothing (refused, or the ledger did not answer), the next one
// becomes the original. Without it, 16 PIX racing with one key and 16 bodies waited at once on
// the payer's row lock in the ledger, each holding a connection.
//
// It costs a map entry per key in progress and a channel operation. A request waits at most
// wait (the longest PIX's ledger time, within what the write timeout leaves) or until its client
// leaves; past it, it goes on as before, the ledger keeping the key's guarantees.
type originals struct {
	wait time.Duration
	mu   sync.Mutex
	keys map[string]*turn
}

// turn is one key's: a token while a request is in progress, and how many hold or want it.
type turn struct {
	token chan struct{}
	users int
}

func newOriginals(wait time.Duration) *originals {
	return &originals{wait: wait, keys: map[string]*turn{}}
}

// enter waits for key's turn, at most o.wait and until the deadline, and returns what ends it.
func (o *originals) enter(ctx context.Context, key string, deadline time.Time) (leave func()) {
	o.mu.Lock()
	t := o.keys[key]
	if t == nil {
		t = &turn{token: make(chan struct{}, 1)}
		o.keys[key] = t
	}
	t.users++
	o.mu.Unlock()
	done := func() {
		o.mu.Lock()
		if t.users--; t.users == 0 {
			delete(o.keys, key)
		}
		o.mu.Unlock()
	}
	select {
	case t.token <- struct{}{}:
		return func() { <-t.token; done() }
	default:
	}
	timer := time.NewTimer(min(o.wait, time.Until(deadline)))
	defer timer.Stop()
	select {
	case t.token <- struct{}{}:
		return func() { <-t.token; done() }
	case <-timer.C: // the original outlasted the longest PIX: the ledger keeps the key's guarantees
	case <-ctx.Done():
	}
	return done
}
