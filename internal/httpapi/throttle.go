package httpapi

import (
	"cmp"
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/pixlimit/pixlimit/internal/ratelimit"
	"github.com/pixlimit/pixlimit/internal/ratelimit/queue"
)

// Throttling: a route whose limit is a queue (leaky_bucket) holds an admitted request until its
// turn, within the wait the write timeout leaves (limiter.maxWait): the limiter refuses at once a
// turn that would come later. A queued PIX takes its in-flight slot at its turn (admission.go).

// defaultMaxWait and defaultBudget are the wait and the decision's budget of a limiter built
// without them (a middleware's): the defaults of the server's and of ratelimit.Options.Timeout.
const (
	defaultMaxWait = 5 * time.Second
	defaultBudget  = 100 * time.Millisecond
)

// throttle is the context a queued request decides and waits under: the request's, with the
// deadline of the longest wait and the decision's own budget (the limiter takes that budget off
// the wait it offers, for the call's way there and back).
func (r limiter) throttle(c echo.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(c.Request().Context(), r.throttleBudget())
}

// throttleUntil is throttle for a request whose waits began before its decision (a PIX waits
// for its key's original and its place of the ledger first): its turn comes by until, when its
// longest wait ends, so that those waits and its turn's fit together in what the write timeout
// leaves; the decision's own budget comes after it (after now, if those waits took them all).
func (r limiter) throttleUntil(c echo.Context, until time.Time) (context.Context, context.CancelFunc) {
	if now := time.Now(); now.After(until) {
		until = now
	}
	return context.WithDeadline(c.Request().Context(), until.Add(cmp.Or(r.budget, defaultBudget)))
}

// throttleBudget is the longest wait and the decision's own budget.
func (r limiter) throttleBudget() time.Duration {
	return cmp.Or(r.maxWait, defaultMaxWait) + cmp.Or(r.budget, defaultBudget)
}

// wait holds the request of c, admitted by d over cs in took, until its turn, and counts how it
// ended: throttled (served after waiting) or abandoned (its client left first, giving its place
// back). Its answer says how long it waited (Server-Timing: throttle;dur=ms), 0 when its turn was
// now. A shadow limit never waits. A replica holding its most waiters refuses it, 429.
func (r limiter) wait(c echo.Context, ctx context.Context, cs []check, d ratelimit.Decision, took time.Duration) error {
	if !d.Allowed || cs[0].shadow || cs[0].Policy.Algorithm != ratelimit.LeakyBucket {
		return nil
	}
	if d.Wait <= 0 {
		c.Response().Header()["Server-Timing"] = []string{"throttle;dur=0"}
		return nil
	}
	start := time.Now()
	err := queue.ErrTooManyWaiting // no Queue (a tier made a queue of a route without one): refused
	if r.queue != nil {
		err = r.queue.Wait(ctx, d)
	}
	waited := time.Since(start)
	c.Response().Header()["Server-Timing"] = []string{"throttle;dur=" + strconv.FormatInt(waited.Milliseconds(), 10)}
	decided := checks(cs)
	if d.Fallback { // counted as decided_local already: only its wait is measured
		decided = nil
		r.metrics.waitedOnly(checks(cs), waited)
	}
	switch {
	case errors.Is(err, queue.ErrTooManyWaiting),
		err != nil && c.Request().Context().Err() == nil: // the wait's deadline, not the client, ended it
		r.metrics.decided(decided, outcomeRefused, took)
		// Refused after all: the headers say so, as a refusal's would (no place, retry in a pace).
		refused := d.Worst
		refused.Remaining, refused.Reset, refused.RetryAfter = 0, refused.Policy.Pace(), refused.Policy.Pace()
		setHeaders(c.Response().Header(), ratelimit.Decision{Worst: refused, Results: []ratelimit.Result{refused}})
		return &Error{Code: CodeRateLimitExceeded, RetryAfter: refused.RetryAfter}
	case err != nil:
		r.metrics.waited(decided, outcomeAbandoned, took, waited)
		return err
	}
	r.metrics.waited(decided, outcomeThrottled, took, waited)
	return nil
}

// giveTurnBack gives back the turn of d, a queued request's admission that will not be served
// after all though its turn came (package queue's GiveBack): it spent nothing of its limit.
func (r limiter) giveTurnBack(d ratelimit.Decision) {
	if r.queue != nil {
		r.queue.GiveBack(d)
	}
}
