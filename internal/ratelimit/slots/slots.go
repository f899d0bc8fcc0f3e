// Package slots owns in-flight slots: at most Count requests of one identity in progress at
// once, fleet-wide, each holding its slot under a lease (a company's payroll cannot hold every
// ledger connection). A rate limit counts requests that started; a slot counts those that have
// not ended, which no window foretells.
//
// What it buys: a bound on one identity's share of a scarce resource (the ledger's connections)
// that holds across every replica. What it costs: a slot is taken and given back, two steps
// more per request (on one Redis they ride in the request's other calls: package sequence), and
// a replica that dies holding one keeps it until its lease ends.
//
// Its script is slots.lua, generated from lua/slots.lua with the algorithms' prelude, so that
// the same body runs alone and in a sequence's script.
package slots

import (
	"context"
	_ "embed"
	"sync"
	"time"

	"github.com/pixlimit/pixlimit/internal/ratelimit"
	"github.com/redis/go-redis/v9"
)

//go:embed slots.lua
var source string

// Script is slots.lua, which holds, asks and releases slots alone: what package warm loads.
func Script() *redis.Script { return script }

var script = redis.NewScript(source)

// Slots are an identity's in-flight slots: Count of them, each held under a lease of Lease (a
// slot whose replica died holding it frees when its lease ends). Name names their keys.
type Slots struct {
	Name  string
	Count int
	Lease time.Duration
}

// Holder names one request's hold on the slot called name (a PIX's Idempotency-Key, of
// [A-Za-z0-9_-]): requests of one name share one slot, each with a hold of its own, so that each
// gives back only its own.
func Holder(name string) string { return name + ":" + ratelimit.RequestID() }

// Hold takes one of identity's slots for a request about to start, as holder (Holder): refused
// while every slot is held by other requests. A request whose slot's name is already held (a
// replay of a request still in progress) shares it, never refused. The caller gives its hold back
// with Release when the request ends. Slots bypass the deny cache: they free when requests end,
// which no Reset foretells.
func (s Slots) Hold(identity, holder string) ratelimit.Step {
	return &step{s.check(identity), holder, ratelimit.TakeOp()}
}

// Ask asks whether Hold(identity, holder) would take its slot, taking nothing: a PIX asks
// before its own limit decides and takes the slot after it, in one atomic Decide, so that
// neither a refused limit holds a slot nor a full slot records a PIX. (Where a Decide is a call
// per step, the ask would not hold till the take: the PIX takes first, and gives back.)
func (s Slots) Ask(identity, holder string) ratelimit.Step {
	return &step{s.check(identity), holder, ratelimit.AskOp()}
}

// Release gives back holder's hold of identity's slot (Hold). It is never refused; when Redis
// does not answer, Retry sends it again, or the hold ends with its lease.
func (s Slots) Release(identity, holder string) ratelimit.Step {
	return &step{s.check(identity), holder, ratelimit.WithdrawOp(0)}
}

// Retry releases holds again whose release Redis did not answer, in the background, until Redis
// answers or their lease has passed, when they have freed by themselves: a stall of Redis
// shorter than a lease must not keep an identity's slots taken after Redis returns (one request
// at a time would be refused for the rest of the lease). A release drops a hold by its own
// name, so sending it again is safe. What it costs: a goroutine per release waiting (at most
// its bound), and an attempt per second each while Redis does not answer. (An attempt sent into
// a frozen Redis may run, once it thaws, before the call that took the hold, sent first on
// another connection: that hold is left to its lease.)
type Retry struct {
	d       ratelimit.Decider
	waiting chan struct{}
	done    chan struct{} // closed by Close: the retries stop
	wg      sync.WaitGroup

	mu     sync.Mutex // orders a retry's start (wg.Add) before Close's wait
	closed bool
}

// NewRetry returns a Retry that releases through d, at most bound releases waiting at once.
// Close stops it.
func NewRetry(d ratelimit.Decider, bound int) *Retry {
	return &Retry{d: d, waiting: make(chan struct{}, bound), done: make(chan struct{})}
}

// Release sends steps, releases (Release) whose call Redis did not answer, again, backing off
// from 50ms to once a second, until Redis answers them, the longest of their leases has passed
// or r is closed. It reports false, sending nothing, when its bound of releases already wait,
// or r is nil or closed: those are left to their lease.
func (r *Retry) Release(steps ...ratelimit.Step) bool {
	if r == nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	select {
	case r.waiting <- struct{}{}:
	default:
		return false
	}
	var lease time.Duration
	for _, s := range steps {
		for _, c := range s.Checks() {
			lease = max(lease, c.Policy.Window)
		}
	}
	r.wg.Add(1)
	go func() {
		defer func() { <-r.waiting; r.wg.Done() }()
		ctx, cancel := context.WithTimeout(context.Background(), lease)
		defer cancel()
		for wait := 50 * time.Millisecond; ; wait = min(2*wait, time.Second) {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-r.done:
				t.Stop()
				return
			case <-t.C:
			}
			if _, err := r.d.Decide(ctx, steps...); err == nil {
				return
			}
		}
	}()
	return true
}

// Close stops the retries and waits for them (an attempt under way ends within its Decider's
// budget): what they would have released is left to its lease. Call it before closing what the
// Decider asks.
func (r *Retry) Close() {
	r.mu.Lock()
	if !r.closed {
		r.closed = true
		close(r.done)
	}
	r.mu.Unlock()
	r.wg.Wait()
}

// check is the slots' key and settings as a step's check: the count as its limit, the lease as
// its window (what slots.lua reads).
func (s Slots) check(identity string) ratelimit.Check {
	return ratelimit.Check{Policy: ratelimit.Policy{Name: s.Name, Limit: s.Count, Window: s.Lease}, Identity: identity}
}

// step is a hold, an ask or a release of one slot.
type step struct {
	c      ratelimit.Check
	holder string
	op     ratelimit.Op
}

func (s *step) Checks() []ratelimit.Check { return []ratelimit.Check{s.c} }

// Script: a slot is no full key (it frees when a request ends, which no Reset foretells), so a
// deny cache never remembers one.
func (s *step) Script() ratelimit.StepScript {
	return ratelimit.StepScript{Body: "slots", Alone: script, ID: s.holder, Op: s.op}
}
