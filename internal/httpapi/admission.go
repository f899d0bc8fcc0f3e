package httpapi

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/pixlimit/pixlimit/internal/auth"
	"github.com/pixlimit/pixlimit/internal/enforce"
	"github.com/pixlimit/pixlimit/internal/pix"
	"github.com/pixlimit/pixlimit/internal/ratelimit"
	"github.com/pixlimit/pixlimit/internal/ratelimit/slots"
)

// A PIX's admission, the whole of what limits one PIX (handlePIX tells the rest of its story):
// admit decides it, in one limiter call, before the ledger; the ticket it returns settles it, in
// one more, after the ledger has answered.
//
// The call decides, in order and stopping at the first refusal: whether the payer's DICT bucket
// of the key's type and the bank's could pay for a miss (asked, taking nothing), whether one of
// the account's in-flight slots is free (asked, taking nothing), the PIX's own limit, and then
// takes a miss's price from both buckets, the slot and the key's mark (its original, for
// replays); where the steps are calls of their own (a cluster), the price and the slot are taken
// before the limit instead (newAdmission). While either bucket holds no token the PIX is refused
// (429, policy pix-lookup or pix-lookup-v2; or 503 lookup_capacity_exhausted) whether or not its
// key exists, and its own limit records nothing: a PIX to a key nobody has answers 404 as a
// look-up does, so it is paid for like one, or PIX would be the way to enumerate keys once
// look-ups are refused; its price is taken before the ledger and given back after it unless the
// key was missing (ticket.settle), so PIX sent together learn no more keys than one by one. While
// every slot is held by other PIX, 429 pix-concurrency; else its own limit decides as any
// route's. A bucket that cannot be asked (Redis down) leaves the PIX to its own limit's fail
// mode. A queued PIX (leaky_bucket) waits for its turn, then takes its slot and mark in a call of
// its own: it holds none while it waits. The slot and the mark are this file's last two types;
// the buckets are buckets.go's.

// admissions admit PIX: a PIX's own limit (its account's tier's), its in-flight slot and its key's
// mark, and the DICT buckets (package dict) it may pay.
type admissions struct {
	buckets
	limit, inflight enforce.RouteLimit // the PIX's limit before its tier, and the account's in-flight slots
	lease           time.Duration      // a mark outlasts the longest PIX, as a slot does (its lease)
}

func newAdmissions(b buckets, limit, inflight enforce.RouteLimit) admissions {
	return admissions{buckets: b, limit: limit, inflight: inflight, lease: cmp.Or(inflight.Policy.Window, 15*time.Second)}
}

// ticket is an admitted PIX's hold on what its admission took (its slot and mark) and on the
// bucket that pays for its key (user): settle gives them back.
type ticket struct {
	pa   admissions
	c    echo.Context
	s    auth.Subject
	user check // the payer's bucket of the key's type
	// price gives back the miss's price its admission took from both buckets (admission.price);
	// none when Redis did not answer it, whose miss the buckets' fail mode answers (settle).
	price []ratelimit.Step
	key   string
	held  *slot // nil: PIX_CONCURRENCY off
	orig  *mark
	turn  ratelimit.Decision // a queued PIX's admission: its place, given back if the ledger is busy
	// unanswered is why Redis did not answer the admission's call (nil when it did): the PIX then
	// went through by its fail mode, and its settlement is not waited for (settle).
	unanswered error
}

// admission is the steps of one PIX's admission call, kept to read each one's decision.
type admission struct {
	ask, limit                  ratelimit.Step // ask is nil when not in the call
	payUser, payBank            ratelimit.Step // a miss's price, taken
	askSlot, takeSlot, takeMark ratelimit.Step // nil when not in the call
	user, bank                  check
	userCost, bankCost          int
	steps                       []ratelimit.Step
	queued                      bool
	held                        *slot
	orig                        *mark
}

// admit decides s's PIX req under its own limit own (pa.own), its in-flight slot and its key's
// mark: a refused or failed admission answers the PIX (an *Error, or the fail mode's), and gives
// back what the call took. A queued PIX's turn comes by waitUntil. A PIX whose mark another
// replica's original holds waits for that original to answer, at most until originalUntil
// (mark.wait).
func (pa admissions) admit(c echo.Context, s auth.Subject, req pixRequest, own check, waitUntil, originalUntil time.Time) (ticket, error) {
	held, orig := slotOf(pa.inflight, s.Account, req.IdempotencyKey), markOf(pa.lease, s.Account, req.IdempotencyKey)
	user, bank := pa.bucket(s, req.keyType), pa.bank()
	userCost, bankCost := pa.rules.Price(false)
	tk := ticket{pa: pa, c: c, s: s, user: user, key: req.ToKey, held: held, orig: orig}
	// Refused from memory: asking the buckets would change nothing. (Not a shadow limit's: it
	// refuses nothing, so its memory of a full key ends no admission.)
	if !own.shadow {
		if d, full := pa.knownFull(own.Check); full {
			_, err := pa.answer(c, nil, []check{own}, []ratelimit.Check{own.Check}, d, nil, 0)
			return tk, err
		}
	}
	a := newAdmission(user, bank, userCost, bankCost, own, held, orig, pa.core.Atomic())
	ctx, cancel := pa.throttleUntil(c, waitUntil) // a queue's turn comes within the PIX's waits
	defer cancel()
	// A client that hangs up does not cut the call short: a slot it took is then given back here.
	deadline, _ := ctx.Deadline()
	callCtx, cancelCall := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	decided := pa.sequenceOf(callCtx, a.steps...)
	cancelCall()
	tk.unanswered, tk.price = decided.err, a.price(decided)
	// Redis down: the PIX's own limit answers, by its own fail mode; the buckets' ask, which
	// would have refused nothing then, is neither logged nor counted as failing open.
	if decided.err == nil {
		if a.ask != nil {
			if err := pa.answerAsk(c, user, bank, true, decided, a.ask); err != nil {
				return tk, pa.giveBack(c, a, decided, err)
			}
		}
		if decided.recorded(a.payUser) && a.ask == nil || decided.refused(a.payUser) || decided.refused(a.payBank) {
			// The buckets' answer when the price was taken with no ask (after one, in the same
			// script, it is never refused), or refused.
			if err := pa.answerPrice(c, user, bank, decided, a.payUser, a.payBank); err != nil {
				return tk, pa.giveBack(c, a, decided, err)
			}
		}
	}
	for _, step := range []ratelimit.Step{a.askSlot, a.takeSlot} { // the slot asked, or taken (on a cluster, before the limit: newAdmission)
		if d, ran := decided.ds.Of(step); ran {
			if err := held.answer(c, pa.limiter, own, d, nil, decided.took); err != nil {
				return tk, pa.giveBack(c, a, decided, err)
			}
		}
	}
	d, err := pa.answerStep(c, nil, []check{own}, decided, a.limit)
	if err != nil {
		return tk, pa.giveBack(c, a, decided, err)
	}
	if !a.queued {
		switch {
		case decided.refused(a.takeMark): // another replica's original is in progress
			orig.wait(ctx, pa.decider(), originalUntil, false, held.renew()...)
		case !decided.admitted(a.takeMark) && decided.err == nil: // a shadow refusal ended the sequence before it
			orig.wait(ctx, pa.decider(), originalUntil, true, held.renew()...)
		}
		return tk, nil
	}
	tk.turn = d
	if err := pa.atTurn(c, ctx, own, d, decided.took, held, orig, originalUntil); err != nil {
		pa.release(context.WithoutCancel(c.Request().Context()), nil, tk.price...) // its price, as its turn, given back
		return tk, err
	}
	return tk, nil
}

// newAdmission lays out the call: the buckets asked; then the slot asked, the limit, a miss's
// price taken from each bucket, the slot taken, the mark taken. In one atomic script (atomic)
// the buckets asked to pay are the buckets paid, and the slot asked free is the slot taken: a PIX
// the limit refuses took nothing, in one call. Where each step is a call of its own (a Redis
// Cluster), a PIX of the same payer or account could take the last token or slot between the ask
// and the take, after the limit had admitted this one: so the slot and then the price are taken
// first (no ask; the slot first, so that PIX the slots refuse hold no price), and a PIX refused
// them has spent nothing of its limit; one the limit then refuses gives them back (giveBack). A
// limit in shadow mode never refuses, so the slot and the price are taken before it too, after
// the ask in one script (a shadow refusal ends the sequence). A queued PIX takes its slot and mark
// at its turn.
func newAdmission(user, bank check, userCost, bankCost int, own check, held *slot, orig *mark, atomic bool) admission {
	a := admission{limit: ratelimit.AllowStep(own.Check), queued: own.Policy.Algorithm == ratelimit.LeakyBucket,
		payUser: ratelimit.ChargeStep(user.Check, userCost), payBank: ratelimit.ChargeStep(bank.Check, bankCost),
		user: user, bank: bank, userCost: userCost, bankCost: bankCost, held: held, orig: orig}
	slotted := held != nil && !a.queued
	if atomic { // the buckets asked first: refused there, the PIX took nothing, in one call
		a.ask = ratelimit.AskStep(user.Check, bank.Check)
		a.steps = []ratelimit.Step{a.ask}
	}
	if atomic && !own.shadow {
		if slotted {
			a.askSlot = held.ask()
			a.steps = append(a.steps, a.askSlot)
		}
		a.steps = append(a.steps, a.limit, a.payUser, a.payBank)
		if slotted {
			a.takeSlot = held.hold()
			a.steps = append(a.steps, a.takeSlot)
		}
	} else {
		if slotted {
			a.takeSlot = held.hold()
			a.steps = append(a.steps, a.takeSlot)
		}
		a.steps = append(a.steps, a.payUser, a.payBank, a.limit)
	}
	if !a.queued {
		a.takeMark = orig.take()
		a.steps = append(a.steps, a.takeMark)
	}
	return a
}

// vacant is nil when one of s's account's in-flight slots is free (asked, taking nothing), or
// when Redis could not say (the admission decides then); else the 429 of every slot in use. A PIX
// asks it only when its account holds every one of its places of the ledger on this replica, so
// that it is refused at once, as PIX_CONCURRENCY promises, instead of after waiting for a place:
// one call more, on that path alone.
func (pa admissions) vacant(c echo.Context, s auth.Subject, idem string, own check) error {
	held := slotOf(pa.inflight, s.Account, idem)
	if held == nil {
		return nil
	}
	start := time.Now()
	ds, err := pa.decider().Decide(c.Request().Context(), held.ask())
	return held.answer(c, pa.limiter, own, ds.Last(), err, time.Since(start))
}

// giveBack returns err, having given back, with a refused or failed admission, a hold its call
// may have taken: one it took, or, when Redis did not answer, one it may have taken (the script
// may have run; a hold's name is its own, so giving back one never taken changes nothing). When
// Redis did not answer, the answer does not wait for the release too (a fail mode waits no
// longer than the Redis timeout): it is sent on its way, within its own budget.
func (pa admissions) giveBack(c echo.Context, a admission, decided sequence, err error) error {
	mayHold := func(s ratelimit.Step) bool {
		return s != nil && (decided.admitted(s) || decided.err != nil && !decided.refused(s))
	}
	var release []ratelimit.Step
	if mayHold(a.takeSlot) {
		release = a.held.release()
	}
	if mayHold(a.takeMark) {
		release = append(release, a.orig.release()...)
	}
	ctx := context.WithoutCancel(c.Request().Context())
	if decided.err != nil {
		go pa.release(ctx, release, a.price(decided)...)
		return err
	}
	pa.release(ctx, release, a.price(decided)...)
	return err
}

// price is what gives back the miss's price the call took (decided): a refund of each bucket
// whose charge ran and was admitted. A charge whose call failed may have run, or not: giving
// back tokens it never took would pay the payer for nothing, so it is not given back (the
// strict side; a token bucket refills).
// A charge a layer answered without asking Redis (a queue's, before the step it refused from
// memory) took nothing (Decision.Recorded).
func (a admission) price(decided sequence) []ratelimit.Step {
	var give []ratelimit.Step
	if decided.recorded(a.payUser) {
		give = append(give, ratelimit.RefundStep(a.userCost, a.user.Check))
	}
	if decided.recorded(a.payBank) {
		give = append(give, ratelimit.RefundStep(a.bankCost, a.bank.Check))
	}
	return give
}

// atTurn holds a queued PIX, admitted by d over own in took, until its turn, then takes its slot
// and its mark (waiting for another replica's original until originalUntil), as an unqueued
// PIX's call takes them. Refused its slot then, it gives its turn back: as an unqueued PIX
// refused its slot, it spent nothing of its own limit. A slot Redis does not answer is the
// PIX's fail mode's to decide, as its admission's outage would be (the slot's check has it):
// closed, the PIX is refused and gives its turn back (and the hold the call may have taken);
// open, it goes on without its slot.
func (pa admissions) atTurn(c echo.Context, ctx context.Context, own check, d ratelimit.Decision, took time.Duration, held *slot, orig *mark, originalUntil time.Time) error {
	if err := pa.wait(c, ctx, []check{own}, d, took); err != nil {
		return err
	}
	if held != nil {
		start := time.Now()
		hds, err := pa.decider().Decide(context.WithoutCancel(ctx), held.hold())
		if err != nil {
			slot := []check{held.check}
			if _, err := pa.answer(c, nil, slot, checks(slot), ratelimit.Decision{}, err, time.Since(start)); err != nil {
				pa.giveTurnBack(d)
				go pa.release(context.WithoutCancel(ctx), held.release())
				return err
			}
		} else if err := held.answer(c, pa.limiter, own, hds.Last(), nil, time.Since(start)); err != nil {
			pa.giveTurnBack(d)
			return err
		}
	}
	orig.wait(ctx, pa.decider(), originalUntil, true, held.renew()...)
	return nil
}

// settle settles the buckets once the ledger has answered the PIX (r, err), gives the PIX's
// in-flight slot and mark back in the same call, and returns the PIX's answer: a PIX to a key
// nobody has paid the miss in its admission; any other gives the price back, and a 201 also the
// tokens of the look-up that led to it, if there was one (refund; a replayed 201, which moved
// nothing, gives none). The slot goes back even when the client has left. A queued PIX answered
// ledger_busy (it takes its place of the ledger at its turn: handlePIX) gives its turn back too:
// like any PIX answered so, it spent no quota.
//
// When Redis did not answer the admission (a PIX let through by PIX_FAIL_MODE=open), the answer
// does not wait for Redis a second time, as a fail mode waits no longer than the Redis timeout:
// the settlement is sent on its way, and a miss, whose charge decides its answer, is answered
// as the look-up's buckets answer when Redis cannot decide (closed: 429).
func (t ticket) settle(r pix.Receipt, err error) error {
	release := append(t.held.release(), t.orig.release()...)
	ctx := context.WithoutCancel(t.c.Request().Context())
	settled := func(f func()) { f() }
	if t.unanswered != nil {
		settled = func(f func()) { go f() }
	}
	switch {
	case errors.Is(err, pix.ErrKeyNotFound) && t.unanswered != nil:
		settled(func() { t.pa.release(ctx, release, t.price...) })
		_, closed := t.pa.answer(t.c, nil, []check{t.user}, []ratelimit.Check{t.user.Check}, ratelimit.Decision{}, t.unanswered, 0)
		return cmp.Or(closed, err) // the buckets fail closed: a 429; were one ever to fail open, the 404
	case errors.Is(err, pix.ErrKeyNotFound): // paid in its admission
		t.pa.release(ctx, release)
	case err == nil && !r.Replayed:
		settled(func() { t.pa.refund(ctx, t.s, t.user, t.key, release, t.price...) })
	default:
		if errors.Is(err, pix.ErrLedgerBusy) {
			t.pa.giveTurnBack(t.turn)
		}
		settled(func() { t.pa.release(ctx, release, t.price...) })
	}
	return err
}

// release gives a PIX's slot and mark back (release), and its price (give), in one call, on
// ctx, which the client cannot cancel. A release Redis does not answer is tried again
// (releaseLater); a price is not, as a refund that timed out may have run (giving it twice would
// pay the payer for nothing): it is logged, and lost to the payer, never to the bank.
func (pa admissions) release(ctx context.Context, release []ratelimit.Step, give ...ratelimit.Step) {
	if len(release)+len(give) == 0 {
		return
	}
	if _, err := pa.decider().Decide(ctx, append(release, give...)...); err != nil {
		if len(release) > 0 {
			pa.releaseLater(release, err)
		}
		if len(give) > 0 {
			pa.events.log("refund:pix-price", slog.LevelWarn, "a PIX's look-up price not given back", "cause", err.Error())
		}
	}
}

// releaseLater hands a release of slots and marks whose call Redis did not answer (cause) to the
// replica's slots.Retry, which sends it again until Redis answers or the holds' lease has passed,
// and logs which.
func (r limiter) releaseLater(steps []ratelimit.Step, cause error) {
	if r.retry.Release(steps...) {
		r.events.log("release:pix-slots", slog.LevelWarn, "an in-flight slot or a PIX's mark not given back: sent again until Redis answers or its lease ends",
			"cause", cause.Error())
		return
	}
	r.events.log("release:pix-slots-lease", slog.LevelWarn, "an in-flight slot or a PIX's mark not given back: it frees at its lease (no room to send it again)",
		"cause", cause.Error())
}

// slot is the in-flight slot a PIX of s's account named idem holds (nil when PIX_CONCURRENCY is
// off): the request's Idempotency-Key names it, so that a replay of a PIX in progress shares its
// original's slot and waits for its answer in the ledger, never refused. The limit's policy
// counts the account's slots (its limit) and leases them (its window).
func slotOf(limit enforce.RouteLimit, account, idem string) *slot {
	p := limit.Policy
	if p.Limit < 1 {
		return nil
	}
	return &slot{check: checkOf(limit, account), slots: slots.Slots{Name: p.Name, Count: p.Limit, Lease: p.Window},
		name: slots.Holder(idem)}
}

type slot struct {
	check check
	slots slots.Slots
	name  string // this request's hold (slots.Holder): a replay shares the slot, never the hold
}

// answer answers a slot's step (its ask, or its hold at a queued PIX's turn), counting a
// refusal in r's metrics: nil when held or when Redis could not say (the PIX's own limit answers
// an outage, by its fail mode). A PIX whose account has every slot in use is refused 429 with
// Retry-After 1 (a slot frees when a PIX ends, which no clock foretells), and the slot's
// RateLimit headers beside the PIX's policy, as the draft's concurrent-requests quota: a policy
// with no window (appendPolicyItem).
func (s *slot) answer(c echo.Context, r limiter, own check, d ratelimit.Decision, err error, took time.Duration) error {
	if err != nil || d.Allowed {
		return nil
	}
	r.metrics.decided([]ratelimit.Check{s.check.Check}, outcomeRefused, took)
	inProgress := ratelimit.Result{Policy: ratelimit.Policy{Name: s.slots.Name, Limit: s.slots.Count},
		Capacity: s.slots.Count, Reset: time.Second, RetryAfter: time.Second}
	setHeaders(c.Response().Header(), ratelimit.Decision{Worst: inProgress, Results: []ratelimit.Result{{Policy: own.Policy}, inProgress}})
	return &Error{Code: CodeRateLimitExceeded, RetryAfter: inProgress.RetryAfter}
}

// renew is the slot held again, which renews its lease (none without a slot).
func (s *slot) renew() []ratelimit.Step {
	if s == nil {
		return nil
	}
	return []ratelimit.Step{s.hold()}
}

// hold and ask are the steps that take the slot and ask whether it would be taken.
func (s *slot) hold() ratelimit.Step { return s.slots.Hold(s.check.Identity, s.name) }
func (s *slot) ask() ratelimit.Step  { return s.slots.Ask(s.check.Identity, s.name) }

// release is the step that gives the slot back, or none.
func (s *slot) release() []ratelimit.Step {
	if s == nil {
		return nil
	}
	return []ratelimit.Step{s.slots.Release(s.check.Identity, s.name)}
}

// mark is a PIX's mark as its Idempotency-Key's original, fleet-wide: a hold of the key's one
// slot, in Redis, whose name no other request shares, so that a second request of the key is
// refused it while the original is in progress, on whatever replica. A PIX takes its mark in its
// admission's call (the last step) and drops it in its settlement's, so the mark costs no call
// of its own; one refused its mark asks again until it gets it (mark.wait), then goes to the
// ledger, which answers it from the original's record. The lease bounds a mark whose replica
// died holding it. originals (idempotency.go) keeps the same order among one replica's requests
// without asking Redis.
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
// takes its mark at its turn, asks at once. Each ask takes renew first, in the same call: the
// PIX's in-flight slot held again (slot.renew), so that its lease, which outlasts the longest PIX,
// counts again from the last ask, after which the PIX's ledger call still comes.
func (m *mark) wait(ctx context.Context, decider ratelimit.Decider, deadline time.Time, askFirst bool, renew ...ratelimit.Step) {
	for ask := askFirst; ; ask = true {
		if ask {
			ds, err := decider.Decide(context.WithoutCancel(ctx), append(renew, m.take())...)
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
