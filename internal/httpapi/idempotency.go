package httpapi

import (
	"context"
	"sync"
	"time"

	"github.com/pixlimit/pixlimit/internal/ratelimit"
	"github.com/pixlimit/pixlimit/internal/ratelimit/slots"
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

// mark is a PIX's mark as its Idempotency-Key's original, fleet-wide: a hold of the key's one
// slot, in Redis, whose name no other request shares, so that a second request of the key is
// refused it while the original is in progress, on whatever replica. A PIX takes its mark in its
// admission's call (the last step) and drops it in its settlement's, so the mark costs no call
// of its own; one refused its mark asks again until it gets it (markWait), then goes to the
// ledger, which answers it from the original's record. The lease bounds a mark whose replica
// died holding it. originals above keeps the same order among one replica's requests without
// asking Redis.
type mark struct {
	slots    slots.Slots
	identity string
	name     string
}

// markOf is the mark of s's account's PIX named idem, leased for lease (the in-flight slots'
// lease, which outlasts the longest PIX).
func markOf(lease time.Duration, account, idem string) *mark {
	// A name of its own (a holder of a holder): no other request shares the slot.
	return &mark{slots: slots.Slots{Name: "pix-original", Count: 1, Lease: lease}, identity: account + ":" + idem,
		name: slots.Holder(slots.Holder("original"))}
}

// take is the step that takes the mark.
func (m *mark) take() ratelimit.Step { return m.slots.Hold(m.identity, m.name) }

// release is the step that drops the mark, or none.
func (m *mark) release() []ratelimit.Step {
	if m == nil {
		return nil
	}
	return []ratelimit.Step{m.slots.Release(m.identity, m.name)}
}

// markPoll is how often a PIX refused its mark asks again: a PIX's ledger time is a few
// milliseconds.
const markPoll = 20 * time.Millisecond

// wait asks for the mark until it is taken, the deadline passes or ctx ends; Redis not answering
// ends it too. Past it, the PIX goes on without the mark: the ledger keeps the key's guarantees.
// A PIX refused its mark in its admission waits a pause before asking again; a queued one, which
// takes its mark at its turn, asks at once.
func (m *mark) wait(ctx context.Context, decider ratelimit.Decider, deadline time.Time, askFirst bool) {
	for ask := askFirst; ; ask = true {
		if ask {
			ds, err := decider.Decide(context.WithoutCancel(ctx), m.take())
			d := ds.Last()
			if err != nil || d.Allowed || !time.Now().Before(deadline) {
				return
			}
		}
		t := time.NewTimer(min(markPoll, time.Until(deadline)))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}
