// Package httpapi is pixlimit's HTTP API: its routes, handlers, request decoding, the RateLimit
// headers and the rate-limit middleware, and the one error handler that maps every error to the
// contract's status codes and JSON bodies. NewServer builds the handler from explicit
// dependencies, so a program, a test or the demo can run several replicas over one Redis and
// one ledger.
package httpapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/pixlimit/pixlimit/internal/auth"
	"github.com/pixlimit/pixlimit/internal/enforce"
	"github.com/pixlimit/pixlimit/internal/pix"
	"github.com/pixlimit/pixlimit/internal/ratelimit"
	"github.com/pixlimit/pixlimit/internal/ratelimit/denycache"
	"github.com/pixlimit/pixlimit/internal/ratelimit/fallback"
	"github.com/pixlimit/pixlimit/internal/ratelimit/queue"
	"github.com/pixlimit/pixlimit/internal/ratelimit/slots"
)

// Deps are what a server needs. Replicas of one fleet share Redis (through their Limiters), the
// token secret and the ledger.
type Deps struct {
	Logger  *slog.Logger
	Limiter *ratelimit.Limiter
	// Stack is what every route decides through: the Limiter and the layers in front of it,
	// the outermost (nil: the Limiter alone). DenyCache, when set, is the deny cache among them:
	// the look-up's PIX asks it first (KnownFull), and a re-tiered account's keys leave it.
	Stack     ratelimit.Decider
	DenyCache *denycache.Cache
	// Queue holds a queue's admissions until their turns (queue.Queue.Wait), and Fallback decides
	// in memory for a limit whose fail mode is local. A server whose limits need one and lacks it
	// is refused.
	Queue    *queue.Queue
	Fallback *fallback.Fallback
	// Releases sends again the releases of in-flight slots and PIX marks Redis did not answer
	// (slots.Retry, which its owner closes); nil: they free at their lease.
	Releases *slots.Retry
	Limits   enforce.RouteLimits
	// OpenAPI is the contract, served at /openapi.yaml (none: no such route); the composition
	// root hands in docs/openapi.yaml, embedded by the module's root package.
	OpenAPI []byte
	// Ledger is the replica's ledger; its calls are timed when it comes wrapped in pix.Timed
	// (reported to Metrics.ObserveLedger), as the composition root passes it to every part alike.
	Ledger pix.Ledger
	// Share is the accounts' share of the ledger (pix.Shared wraps Ledger in it), which a PIX
	// holds from before its admission to its transfer's answer; nil: none.
	Share *pix.Share
	// Tiers, when set, holds each account to its tier's limits; nil: the Limits for everyone.
	Tiers *pix.Tiers
	// LedgerRetryAfter is the Retry-After of a 503 ledger_unavailable: as long as a ledger call
	// may take. Default 1s.
	LedgerRetryAfter time.Duration
	Tokens           *auth.Tokens
	// Passwords checks the passwords of logins and device registrations, at the cost the
	// ledger's hashes have.
	Passwords *auth.Passwords
	// DeviceRegistrationDelay is how long a new device waits to register for PIX while the
	// account has a registered one (DEVICE_REGISTRATION_DELAY); 0 registers at once.
	DeviceRegistrationDelay time.Duration
	// Devices issues and verifies the device tokens of trusted devices.
	Devices *auth.Devices
	// TrustedProxies are the proxies whose X-Forwarded-For names the client (auth.IPExtractor).
	TrustedProxies []netip.Prefix
	// Probes are what /readyz asks, all at once: redis (can the limiter decide?) and the
	// database if there is one; the body lists them in this order.
	Probes []Probe
	// Metrics, when set, counts requests, decisions and ledger calls (NewMetrics).
	Metrics *Metrics
	// Breaker, when set, is the circuit breaker around the Limiter's client: /readyz names it
	// while it is open.
	Breaker Breaker
}

// Breaker is what /readyz reads of a circuit breaker (a *breaker.Breaker).
type Breaker interface {
	Open() bool
}

// Probe is one dependency that /readyz checks.
type Probe struct {
	// Name is the probe's member in the /readyz body: "redis", "database".
	Name string
	// Ping reports whether the dependency answers; /readyz gives it Timeout.
	Ping    func(ctx context.Context) error
	Timeout time.Duration
}

// NewServer returns the API's handler, or an error if Deps cannot make a working server.
func NewServer(d Deps) (http.Handler, error) {
	if d.Logger == nil || d.Limiter == nil || d.Ledger == nil || d.Tokens == nil || d.Devices == nil || d.Passwords == nil {
		return nil, errors.New("httpapi: Deps needs a Logger, a Limiter, a Ledger, Tokens, Devices and Passwords")
	}
	if err := validateTogether(d.Limits.LoginIP, d.Limits.LoginNet, d.Limits.LoginAccount, d.Limits.LoginDevice); err != nil {
		return nil, err
	}
	if err := layersFor(d.Queue != nil, d.Fallback != nil, d.Limits.PIX, d.Limits.Statement, d.Limits.Settings, d.Limits.LoginIP,
		d.Limits.LoginNet, d.Limits.LoginAccount, d.Limits.LoginDevice); err != nil {
		return nil, err
	}
	for _, l := range []enforce.RouteLimit{d.Limits.PIX, d.Limits.Statement, d.Limits.Settings} {
		if err := validateTogether(l); err != nil {
			return nil, fmt.Errorf("httpapi: %w", err)
		}
	}
	for _, l := range []enforce.RouteLimit{d.Limits.PIXLookup, d.Limits.PIXLookupPJ, d.Limits.LookupParticipant} {
		if err := l.Policy.Validate(); err != nil || l.Policy.Algorithm != ratelimit.TokenBucket {
			return nil, fmt.Errorf("httpapi: the key look-up needs valid token_bucket policies (%s: %v)", l.Policy.Name, err)
		}
	}
	if d.Limits.LookupMissCost < 1 || d.Limits.LookupParticipantMissCost < 1 {
		return nil, errors.New("httpapi: the key look-up needs miss costs of at least 1")
	}
	if d.Tiers != nil {
		// A tier change in force: the account's keys leave this replica's deny cache, under the
		// route's algorithm and a tier's queue's alike (the key names the algorithm, not the limit).
		d.Tiers.OnChange(func(account string) {
			if d.DenyCache == nil {
				return
			}
			for _, l := range []enforce.RouteLimit{d.Limits.PIX, d.Limits.Statement} {
				for _, a := range []ratelimit.Algorithm{l.Policy.Algorithm, ratelimit.LeakyBucket} {
					p := l.Policy
					p.Algorithm = a
					d.DenyCache.Forgotten(ratelimit.Check{Policy: p, Identity: account})
				}
			}
		})
	}
	if d.LedgerRetryAfter <= 0 {
		d.LedgerRetryAfter = time.Second
	}
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.IPExtractor = auth.IPExtractor(d.TrustedProxies)
	e.HTTPErrorHandler = errorHandler(d.Logger, d.LedgerRetryAfter)
	routes := map[string]bool{}
	e.Use(edge(d.Logger, newEventLog(d.Logger, 10*time.Second), d.Metrics, routes), limitBody)
	if err := addRoutes(e, d); err != nil {
		return nil, err
	}
	for _, r := range e.Routes() {
		routes[r.Path] = true
	}
	return e, nil
}

// summarized says which answers are logged as counted summaries (edge): the refusals (429),
// which are most requests under a flood, and every other client error (4xx) that no limit counted
// (its answer carries no RateLimit headers), which a client can send without end: a bad token's
// 401, an unknown path's 404, a made-up method's 405, a malformed body's 400, 413 or 415, which
// its route answers before its limit decides (a mistake costs no quota). A 4xx that a limit
// counted keeps its line, as many as the limit lets through (a PIX refused by the night cap);
// so does a failed login's 401, with its client, as a fraud team reads them, even in shadow mode
// or failing open: a password comparison each, one per core at once, bounds them. A request
// shed on purpose (Code.shed: a 503 that spent no quota, sent again at no cost) is summarized too.
func summarized(route string, status int, h http.Header, shed bool) bool {
	switch {
	case status == http.StatusTooManyRequests, shed:
		return true
	case status < 400 || status >= 500, status == http.StatusUnauthorized && route == "/v1/login":
		return false
	}
	return len(h["Ratelimit-Policy"]) == 0 // setHeaders's key, canonical
}

// quiet says which answers are logged at debug level (edge): what a replica answers from memory,
// reading and writing nothing, and that no limit bounds: the probes, which a container engine and
// a proxy send every few seconds, the OpenAPI document, and an OPTIONS (Echo's, the methods a
// route allows).
func quiet(route, method string) bool {
	return route == "/healthz" || route == "/readyz" || route == "/openapi.yaml" || method == http.MethodOptions
}

// marks marks an answer, as its status is written, not to be stored by any cache (a login's
// tokens, a balance), unless its handler said otherwise (the OpenAPI document), and not to be
// read as another type than it says. A 429 is left as light as a refusal can be (its two headers
// more cost a flood's refusals measurably: BenchmarkRefusal): no cache stores one (RFC 9111,
// none without an explicit freshness), and it is JSON, as it says.
func marks(res *echo.Response) {
	if res.Status == http.StatusTooManyRequests {
		return
	}
	h := res.Header()
	if h.Get("Cache-Control") == "" {
		h.Set("Cache-Control", "no-store")
	}
	h.Set("X-Content-Type-Options", "nosniff")
}

// marked is marks as a middleware, for a listener without edge (the desk).
func marked(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		res := c.Response()
		res.Before(func() { marks(res) })
		return next(c)
	}
}

// edge is the outermost middleware, the one place every request ends: it turns a panic into an
// error (with its stack, for the log), writes every error once through the error handler (the
// JSON body), then logs one line per request and counts it, so a panic is a 500 that the log and
// the metrics see like any other. It marks every answer but a refusal for caches and browsers
// (marks).
//
// The line says method, route, status, duration and client address; never the body, the query
// or the headers, so no CPF, password or token reaches the log. What a replica answers from
// memory without a limit (quiet) is logged at debug level. Labels
// and logged names come from fixed sets: the route templates registered (routes, filled once
// they are) or "unmatched", the standard methods or "other", so that no request mints a series.
// Client errors, the refusals among them, are logged as counted summaries (summarized), per route
// and status at most once per interval of floods: under attack they are most requests, and a
// line each would cost more than the answer.
func edge(logger *slog.Logger, floods *eventLog, m *Metrics, routes map[string]bool) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			start := time.Now()
			res := c.Response()
			res.Before(func() { marks(res) })
			err := recovering(next, c)
			if err != nil {
				c.Error(err) // write the response now, so the status logged and counted is the one sent
			}
			route, method := c.Path(), methodLabel(c.Request().Method)
			if !routes[route] {
				route = "unmatched"
			}
			took := time.Since(start)
			m.observe(route, method, c.Response().Status, took)
			status := c.Response().Status
			shed := status == http.StatusServiceUnavailable && err != nil && toError(err, 0).Code.shed()
			if summarized(route, status, res.Header(), shed) {
				key := route // floods holds the refusals alone: the route, and the status but a 429's
				if status != http.StatusTooManyRequests {
					key += " " + strconv.Itoa(status)
				}
				if held, due := floods.due(key); due {
					logger.LogAttrs(c.Request().Context(), slog.LevelInfo, "requests refused", slog.String("route", route),
						slog.Int("status", status), slog.Int("held_back", held))
				}
				return nil
			}
			level := slog.LevelInfo
			if quiet(route, method) {
				level = slog.LevelDebug
			}
			logger.LogAttrs(c.Request().Context(), level, "request",
				slog.String("method", method),
				slog.String("route", route),
				slog.Int("status", c.Response().Status),
				slog.Duration("duration", took),
				slog.String("client", c.RealIP()))
			return nil
		}
	}
}

// recovering calls next, turning a panic into an internal error that carries its stack.
// http.ErrAbortHandler, the one panic meant to abort a response, goes on.
func recovering(next echo.HandlerFunc, c echo.Context) (err error) {
	defer func() {
		if r := recover(); r != nil {
			if r == http.ErrAbortHandler {
				panic(r)
			}
			err = &Error{Code: CodeInternal, cause: fmt.Errorf("panic: %v\n%s", r, debug.Stack())}
		}
	}()
	return next(c)
}

// methodLabel is the request's method if it is a standard one, else "other".
func methodLabel(method string) string {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete,
		http.MethodOptions, http.MethodConnect, http.MethodTrace:
		return method
	}
	return "other"
}
