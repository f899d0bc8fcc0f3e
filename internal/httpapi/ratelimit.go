package httpapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"

	"github.com/pixlimit/pixlimit/internal/enforce"
	"github.com/pixlimit/pixlimit/internal/ratelimit"
	"github.com/pixlimit/pixlimit/internal/ratelimit/denycache"
	"github.com/pixlimit/pixlimit/internal/ratelimit/fallback"
	"github.com/pixlimit/pixlimit/internal/ratelimit/queue"
	"github.com/pixlimit/pixlimit/internal/ratelimit/slots"
)

// setHeaders writes a decision to h as the contract's headers, after the IETF draft
// "RateLimit header fields for HTTP" (draft-ietf-httpapi-ratelimit-headers-12) and the older,
// widely parsed RateLimit-Limit/-Remaining/-Reset triple:
//
//	RateLimit-Limit: 10
//	RateLimit-Remaining: 7
//	RateLimit-Reset: 42
//	RateLimit-Policy: "pix";q=10;w=60
//	RateLimit: "pix";r=7;t=42
//
// RateLimit-Policy lists every policy of d; everything else reports d.Worst. Times are whole
// seconds rounded up, so a client that waits what it is told is never early. (Retry-After, on a
// refusal, is the error handler's to write.)
func setHeaders(h http.Header, d ratelimit.Decision) {
	w := d.Worst
	reset := seconds(w.Reset)
	// Every value is a piece of one string, written in one buffer: a refusal is answered at a
	// 429's price, not at a few allocations per header (BenchmarkRefusal).
	b := make([]byte, 0, 256)
	var ends [5]int
	b = strconv.AppendInt(b, int64(w.Capacity), 10)
	ends[0] = len(b)
	b = strconv.AppendInt(b, int64(w.Remaining), 10)
	ends[1] = len(b)
	b = strconv.AppendInt(b, reset, 10)
	ends[2] = len(b)
	for i, r := range d.Results {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = appendPolicyItem(b, r.Policy)
	}
	ends[3] = len(b)
	b = append(append(append(b, '"'), w.Policy.Name...), `";r=`...)
	b = append(strconv.AppendInt(b, int64(w.Remaining), 10), ";t="...)
	b = strconv.AppendInt(b, reset, 10)
	ends[4] = len(b)
	all, v := string(b), make([]string, len(ends)) // the header's five values, one backing array
	for i, start := 0, 0; i < len(ends); start, i = ends[i], i+1 {
		v[i] = all[start:ends[i]]
	}
	// The keys in their canonical form (textproto's: "Ratelimit-Limit"), assigned directly: Set
	// would canonicalize each on every response.
	h["Ratelimit-Limit"], h["Ratelimit-Remaining"], h["Ratelimit-Reset"] = v[0:1:1], v[1:2:2], v[2:3:3]
	h["Ratelimit-Policy"], h["Ratelimit"] = v[3:4:4], v[4:5:5]
}

// rateLimitHeaders are the keys setHeaders writes.
var rateLimitHeaders = [...]string{"Ratelimit-Limit", "Ratelimit-Remaining", "Ratelimit-Reset", "Ratelimit-Policy", "Ratelimit"}

// appendPolicyItem appends p as one item of RateLimit-Policy to b: "pix";q=10;w=60. q and w stay
// the sustained rate; a bucket's burst and a queue's places are implementation parameters, which
// draft-12 asks to be vendor-prefixed. No policy a Limiter decides has no window: slot.full's
// report of the in-flight slots has none, and is written as the draft's quota of requests in
// progress, "pix-concurrency";q=2;qu="concurrent-requests".
func appendPolicyItem(b []byte, p ratelimit.Policy) []byte {
	b = append(append(append(b, '"'), p.Name...), `";q=`...)
	b = strconv.AppendInt(b, int64(p.Limit), 10)
	if p.Window == 0 {
		return append(b, `;qu="concurrent-requests"`...)
	}
	b = strconv.AppendInt(append(b, ";w="...), seconds(p.Window), 10)
	switch {
	case p.Algorithm.Bursty():
		b = strconv.AppendInt(append(b, ";pixlimit-burst="...), int64(p.Capacity()), 10)
	case p.Algorithm == ratelimit.LeakyBucket:
		b = strconv.AppendInt(append(b, ";pixlimit-queue="...), int64(p.Queue), 10)
	}
	return b
}

// seconds rounds d up to whole seconds.
func seconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// retrySeconds is seconds(d) but at least 1: "Retry-After: 0" would invite an immediate retry
// that the limiter refuses again.
func retrySeconds(d time.Duration) int64 {
	return max(1, seconds(d))
}

// limiter applies rate-limit decisions to HTTP requests: headers, refusals, fail modes, shadow
// mode and their metrics.
type limiter struct {
	core     *ratelimit.Limiter
	stack    ratelimit.Decider  // what decides: the layers in front of core (nil: core alone)
	cache    *denycache.Cache   // the deny cache among them; nil: none
	queue    *queue.Queue       // holds a queue's admissions; nil: none (layersFor)
	fallback *fallback.Fallback // decides a local fail mode; nil: none (layersFor)
	// failClosedRetryAfter is the Retry-After of a fail-closed policy that could not decide.
	failClosedRetryAfter time.Duration
	metrics              *Metrics  // nil: not measured
	events               *eventLog // nil: shadow refusals and fail modes are not logged
	// maxWait is the longest a queued request waits for its turn (throttle.go); 0: the default.
	maxWait time.Duration
	// budget is one decision's (enforce.RouteLimits.Budget); 0: the default.
	budget time.Duration
	// retry sends again the releases of slots Redis did not answer (releaseLater); nil: none.
	retry *slots.Retry
}

// A report says what an answer shows of a decision: show picks the Decision whose RateLimit
// headers are set (nil: the decision itself), and refuse builds the error of a refusal (nil, or
// a nil *Error: 429 rate_limit_exceeded with the shown key's Retry-After). Each answer is built
// once, where its decision is read: none is rewritten afterwards. A nil *report shows all.
// paying says the decision pays for a request its ask admitted (buckets.charge), whose admission
// the ask counted: its own admission is not counted again, its refusal is.
type report struct {
	show   func(ratelimit.Decision) ratelimit.Decision
	refuse func(shown ratelimit.Decision) *Error
	paying bool
}

// decider is what decides: the stack in front of the Limiter, or the Limiter alone.
func (r limiter) decider() ratelimit.Decider {
	if r.stack != nil {
		return r.stack
	}
	return r.core
}

// knownFull answers checks from the deny cache alone (denycache.Cache.KnownFull); ok false
// without one.
func (r limiter) knownFull(checks ...ratelimit.Check) (ratelimit.Decision, bool) {
	if r.cache == nil {
		return ratelimit.Decision{}, false
	}
	return r.cache.KnownFull(checks...)
}

// enforce decides the request in c against checks and prepares the response: it sets the
// RateLimit headers (they stay on whatever the handler answers next, 4xx included) and returns
// nil when the request may proceed, or a 429 *Error when it may not. report, when not nil,
// chooses what the headers report (none: a Decision with no Results); handlers call enforce
// directly when the identity comes from the body, as the login.
//
// When Redis cannot decide in time the limits' fail modes apply (failMode): closed refuses the
// request with rate_limiter_unavailable; local decides it in the replica's memory at its share
// of each limit, and answers as any decision (headers, 429); open lets it proceed with no
// RateLimit headers, since nothing was decided. Package outages, in the stack, logs the outage; enforce applies the mode.
//
// Limits in shadow mode are decided and counted as usual, but a refusal is served as if
// admitted (shadow_refused, logged without identity), and their responses carry no RateLimit
// headers at all: a limit that is not in force is not advertised.
func (r limiter) enforce(c echo.Context, rep *report, cs ...check) error {
	_, err := r.enforced(c, rep, cs...)
	return err
}

// takeBack withdraws d, the admission of c's request over cs, which the request then shed or
// refused after all (Limiter.Withdraw): what logs one that stays counted (at most once an
// interval). The room it makes is this replica's deny cache's to forget (Cache.Forgotten): a
// refusal of those keys it learnt meanwhile would refuse, from memory, what Redis now admits.
func (r limiter) takeBack(c echo.Context, d ratelimit.Decision, what string, cs ...check) {
	err := r.core.Withdraw(context.WithoutCancel(c.Request().Context()), d)
	if r.cache != nil {
		r.cache.Forgotten(checks(cs)...)
	}
	if err != nil {
		r.events.log("withdraw:"+what, slog.LevelWarn, "an admission taken back, of a request shed or refused after it, stays counted",
			"request", what, "cause", err.Error())
	}
}

// enforced is enforce, and the decision as made: an admission the request's handler may yet take
// back (Limiter.Withdraw), when it sheds the request it admitted (a login answered login_busy).
func (r limiter) enforced(c echo.Context, rep *report, cs ...check) (ratelimit.Decision, error) {
	decided := checks(cs)
	start := time.Now()
	d, err := r.decider().AllowAll(c.Request().Context(), decided...)
	return r.answer(c, rep, cs, decided, d, err, time.Since(start))
}

// apply is enforce with the decision made by decide, over checks (AllowAll, or a ChargeStep for a
// request of a higher cost). It also returns that decision as made, before report, so that a
// caller can tell which check refused (the zero Decision when none was made).
func (r limiter) apply(c echo.Context, rep *report, cs []check,
	decide func(ctx context.Context) (ratelimit.Decision, error)) (ratelimit.Decision, error) {
	start := time.Now()
	d, err := decide(c.Request().Context())
	return r.answer(c, rep, cs, checks(cs), d, err, time.Since(start))
}

// answer is apply for a decision already made (d, or err) over cs (as decided: checks(cs)), in
// took: one step of a ratelimit.Limiter.Decide, whose call's time each step reports.
func (r limiter) answer(c echo.Context, rep *report, cs []check, decided []ratelimit.Check,
	d ratelimit.Decision, err error, took time.Duration) (ratelimit.Decision, error) {
	if err != nil {
		if !errors.Is(err, ratelimit.ErrUnavailable) || c.Request().Context().Err() != nil {
			return ratelimit.Decision{}, err // a client that left: nothing to fail open or closed
		}
		mode := failMode(cs)
		r.events.log("fail:"+cs[0].Policy.Name, slog.LevelWarn, "rate limiter unavailable: fail mode applied",
			"policy", cs[0].Policy.Name, "fail_mode", mode.String())
		if mode == enforce.FailFallback && r.fallback == nil { // layersFor refuses it at startup
			mode = enforce.FailClosed
		}
		switch mode {
		case enforce.FailClosed:
			r.metrics.decided(decided, outcomeFailedClosed, took)
			return ratelimit.Decision{}, &Error{Code: CodeRateLimiterUnavailable, RetryAfter: r.failClosedRetryAfter, cause: err}
		case enforce.FailOpen:
			r.metrics.decided(decided, outcomeFailedOpen, took)
			return ratelimit.Decision{}, nil
		}
		// enforce.FailFallback: decided here, reported and refused as any decision; a queue's turn
		// within what is left of the wait (throttle), as Redis would have given it.
		fctx, cancel := context.WithTimeout(c.Request().Context(), r.throttleBudget()-took)
		d = r.fallback.Allow(fctx, decided...)
		cancel()
	}
	shadow := cs[0].shadow // limits decided together share it (validateTogether)
	switch {
	case d.Fallback:
		r.metrics.decided(decided, outcomeFallback, took)
	case d.Allowed && d.Wait > 0 && !shadow: // counted when its turn comes, or its client leaves (wait)
	case d.Allowed && rep != nil && rep.paying: // counted by its ask
	case d.Allowed:
		r.metrics.decided(decided, outcomeAllowed, took)
	case shadow:
		r.metrics.refused(decided, d, outcomeShadowRefused, took)
		r.events.log("shadow:"+d.Worst.Policy.Name, slog.LevelWarn, "shadow limit would have refused", "policy", d.Worst.Policy.Name)
	case d.DenyCached:
		r.metrics.refused(decided, d, outcomeDenyCached, took)
	default:
		r.metrics.refused(decided, d, outcomeRefused, took)
	}
	if shadow {
		return d, nil
	}
	reported := d
	if rep != nil && rep.show != nil {
		reported = rep.show(d)
	}
	if len(reported.Results) > 0 { // a report may keep an admission's headers for a later decision
		setHeaders(c.Response().Header(), reported)
	}
	if !reported.Allowed {
		if rep != nil && rep.refuse != nil {
			if e := rep.refuse(reported); e != nil {
				return d, e
			}
		}
		// The body never names the key that refused: a login refused by its IP key and one refused
		// by its document key have the same body (their RateLimit values name the key).
		return d, &Error{Code: CodeRateLimitExceeded, RetryAfter: reported.Worst.RetryAfter}
	}
	return d, nil
}

// failMode is the fail mode of a request over cs: closed if any enforced check fails closed, else
// local if any does, else open. Shadow limits never refuse, so they fail open.
func failMode(cs []check) enforce.FailMode {
	mode := enforce.FailOpen
	for _, c := range cs {
		switch {
		case c.shadow:
		case c.failMode == enforce.FailClosed:
			return enforce.FailClosed
		case c.failMode == enforce.FailFallback:
			mode = enforce.FailFallback
		}
	}
	return mode
}

// eventLog logs events that may come thousands a second (a shadow refusal, a fail mode applied),
// per event at most once per interval, with how many it held back since; never an identity.
type eventLog struct {
	logger *slog.Logger
	every  time.Duration

	mu   sync.Mutex
	last map[string]time.Time
	held map[string]int
}

func newEventLog(logger *slog.Logger, every time.Duration) *eventLog {
	if logger == nil {
		return nil
	}
	return &eventLog{logger: logger, every: every, last: map[string]time.Time{}, held: map[string]int{}}
}

// log logs msg with attrs unless the event key was logged less than every ago.
func (s *eventLog) log(key string, level slog.Level, msg string, attrs ...any) {
	if held, due := s.due(key); due {
		s.logger.Log(context.Background(), level, msg, append(attrs, "held_back", held)...)
	}
}

// due says whether the event key is to be logged now, with how many were held back since it
// last was, and counts it as held back otherwise: a caller on a hot path builds its line only
// when one is due (the edge's refusals).
func (s *eventLog) due(key string) (held int, due bool) {
	if s == nil {
		return 0, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if now := time.Now(); now.Sub(s.last[key]) >= s.every {
		held, s.last[key], s.held[key] = s.held[key], now, 0
		return held, true
	}
	s.held[key]++
	return 0, false
}

// RateLimitConfig configures the middleware that limits a route by one policy, in the manner of
// Echo's own middleware.
type RateLimitConfig struct {
	// Skipper skips the limiter for requests it returns true for. Default: none skipped.
	Skipper middleware.Skipper
	// Limiter decides. Required. Stack, when set, is the layers in front of it to decide through
	// (a deny cache, a queue); Fallback is required by a local fail mode. A queue's limit
	// (leaky_bucket) is refused: the middleware decides before the handler and holds nothing
	// until a turn.
	Limiter  *ratelimit.Limiter
	Stack    ratelimit.Decider
	Fallback *fallback.Fallback
	// RouteLimit is the limit applied. Required, its policy valid (ratelimit.Policy.Validate).
	RouteLimit enforce.RouteLimit
	// Identify names the client of a request; its error is answered as is (such as 401 for a
	// route limited per account). Default: the client IP from c.RealIP, as
	// ratelimit.IPIdentity, which is only as trustworthy as Echo's IPExtractor.
	Identify func(c echo.Context) (string, error)
	// FailClosedRetryAfter is the Retry-After when a fail-closed Limit cannot be decided.
	// Default 5s.
	FailClosedRetryAfter time.Duration
	// Metrics, when set, counts the decisions. Logger, when set, reports shadow refusals and
	// fail modes applied.
	Metrics *Metrics
	Logger  *slog.Logger
}

// ToMiddleware validates the configuration and returns the middleware.
func (config RateLimitConfig) ToMiddleware() (echo.MiddlewareFunc, error) {
	if config.Limiter == nil {
		return nil, errors.New("httpapi: rate limit middleware needs a Limiter")
	}
	if err := config.RouteLimit.Policy.Validate(); err != nil {
		return nil, fmt.Errorf("httpapi: rate limit middleware: %w", err)
	}
	if err := layersFor(false, config.Fallback != nil, config.RouteLimit); err != nil {
		return nil, fmt.Errorf("rate limit middleware: %w", err)
	}
	if config.Skipper == nil {
		config.Skipper = middleware.DefaultSkipper
	}
	if config.Identify == nil {
		config.Identify = identifyByIP
	}
	if config.FailClosedRetryAfter == 0 {
		config.FailClosedRetryAfter = 5 * time.Second
	}
	r := limiter{core: config.Limiter, stack: config.Stack, fallback: config.Fallback, failClosedRetryAfter: config.FailClosedRetryAfter, metrics: config.Metrics,
		events: newEventLog(config.Logger, 10*time.Second)}
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			if config.Skipper(c) {
				return next(c)
			}
			id, err := config.Identify(c)
			if err != nil {
				return err
			}
			if err := r.enforce(c, nil, checkOf(config.RouteLimit, id)); err != nil {
				return err
			}
			return next(c)
		}
	}, nil
}

// clientIP is the request's client address as Echo's IPExtractor found it.
func clientIP(c echo.Context) (netip.Addr, error) {
	addr, err := netip.ParseAddr(c.RealIP())
	if err != nil {
		return netip.Addr{}, invalid("cannot tell the client address", nil)
	}
	return addr, nil
}

func identifyByIP(c echo.Context) (string, error) {
	addr, err := clientIP(c)
	if err != nil {
		return "", err
	}
	return ratelimit.IPIdentity(addr), nil
}

// sequence is what a Decide returned (the decisions of the steps that ran,
// its error) and how long the call took, for limiter.answer to answer each step.
type sequence struct {
	ds   ratelimit.Decisions
	err  error
	took time.Duration
}

// sequenceOf decides steps in one Decide.
func (r limiter) sequenceOf(ctx context.Context, steps ...ratelimit.Step) sequence {
	start := time.Now()
	ds, err := r.decider().Decide(ctx, steps...)
	return sequence{ds: ds, err: err, took: time.Since(start)}
}

// of is step's decision: the decision made, if the step ran (on a cluster, steps can run before
// one fails); else the sequence's error; else, the sequence having stopped at an earlier refusal
// that its route let through (a shadow limit), an ErrUnavailable, so that the step's fail mode
// answers.
func (s sequence) of(step ratelimit.Step) (ratelimit.Decision, error) {
	d, ran := s.ds.Of(step)
	return whatRan(d, ran, s.err, s.ds.Ran())
}

// whatRan is a step's answer (sequence.of): its decision d if it ran, else the sequence's error,
// else (the sequence stopped after `stopped` steps) an ErrUnavailable.
func whatRan(d ratelimit.Decision, ran bool, err error, stopped int) (ratelimit.Decision, error) {
	switch {
	case ran:
		return d, nil
	case err != nil:
		return ratelimit.Decision{}, err
	}
	return ratelimit.Decision{}, fmt.Errorf("%w: a step of a sequence that stopped after %d", ratelimit.ErrUnavailable, stopped)
}

// admitted says whether step ran and was admitted.
func (s sequence) admitted(step ratelimit.Step) bool {
	d, ran := s.ds.Of(step)
	return ran && d.Allowed
}

// recorded says whether step ran and Redis recorded its admission (not a layer's answer from
// memory: Decision.Recorded).
func (s sequence) recorded(step ratelimit.Step) bool {
	d, ran := s.ds.Of(step)
	return ran && d.Recorded()
}

// refused says whether step ran and was refused.
func (s sequence) refused(step ratelimit.Step) bool {
	d, ran := s.ds.Of(step)
	return ran && !d.Allowed
}

// answerStep is limiter.answer for step of s.
func (r limiter) answerStep(c echo.Context, rep *report, cs []check, s sequence, step ratelimit.Step) (ratelimit.Decision, error) {
	d, err := s.of(step)
	return r.answer(c, rep, cs, checks(cs), d, err, s.took)
}

// first is d as if it had checked only its first check: the same verdict, with that check's
// Result as the worst and only one (the payer's bucket of a look-up, the client IP of a login).
func first(d ratelimit.Decision) ratelimit.Decision {
	d.Worst, d.Results = d.Results[0], d.Results[:1:1]
	return d
}
