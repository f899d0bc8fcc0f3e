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
	"time"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"

	"github.com/pixlimit/pixlimit/internal/auth"
	"github.com/pixlimit/pixlimit/internal/pix"
	"github.com/pixlimit/pixlimit/internal/ratelimit"
)

// Deps are what a server needs. Replicas of one fleet share Redis (through their Limiters), the
// token secret and the ledger.
type Deps struct {
	Logger  *slog.Logger
	Limiter *ratelimit.Limiter
	Limits  Limits
	Ledger  pix.Ledger
	// LedgerRetryAfter is the Retry-After of a 503 ledger_unavailable: as long as a ledger call
	// may take. Default 1s.
	LedgerRetryAfter time.Duration
	Tokens           *auth.Tokens
	// Devices issues and verifies the device tokens of trusted devices.
	Devices *auth.Devices
	// TrustedProxies are the proxies whose X-Forwarded-For names the client (auth.IPExtractor).
	TrustedProxies []netip.Prefix
	// Probes are what /readyz asks, in order: redis first, then the database if there is one.
	Probes []Probe
	// Metrics, when set, counts requests, decisions and ledger calls (NewMetrics).
	Metrics *Metrics
}

// Limits are the routes' rate-limit policies.
type Limits struct {
	PIX, Statement, LoginIP, LoginAccount ratelimit.Policy
	// LoginDevice limits the logins of one trusted device, in place of LoginAccount.
	LoginDevice ratelimit.Policy
	// FailClosedRetryAfter is the Retry-After when a fail-closed policy cannot be decided.
	FailClosedRetryAfter time.Duration
	// PIXLookup is the key look-up's anti-scan token bucket; a look-up that misses costs
	// LookupMissCost tokens, one that finds the key 1.
	PIXLookup      ratelimit.Policy
	LookupMissCost int
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
	if d.Logger == nil || d.Limiter == nil || d.Ledger == nil || d.Tokens == nil || d.Devices == nil {
		return nil, errors.New("httpapi: Deps needs a Logger, a Limiter, a Ledger, Tokens and Devices")
	}
	if err := ratelimit.ValidateTogether(d.Limits.LoginIP, d.Limits.LoginAccount, d.Limits.LoginDevice); err != nil {
		return nil, err
	}
	if err := d.Limits.PIXLookup.Validate(); err != nil || d.Limits.PIXLookup.Algorithm != ratelimit.TokenBucket || d.Limits.LookupMissCost < 1 {
		return nil, fmt.Errorf("httpapi: the key look-up needs a valid token_bucket policy and a miss cost of at least 1 (%v)", err)
	}
	if d.LedgerRetryAfter <= 0 {
		d.LedgerRetryAfter = time.Second
	}
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.IPExtractor = auth.IPExtractor(d.TrustedProxies)
	e.HTTPErrorHandler = errorHandler(d.Logger, d.LedgerRetryAfter)
	e.Use(middleware.Recover()) // a panic becomes a logged 500, never a dropped connection
	if d.Metrics != nil {
		e.Use(d.Metrics.observeRequests)
		d.Ledger = instrumented{Ledger: d.Ledger, m: d.Metrics}
	}
	e.Use(logRequests(d.Logger), limitBody)
	if err := addRoutes(e, d); err != nil {
		return nil, err
	}
	return e, nil
}

// logRequests logs one line per request: method, route, status, duration and client address.
// Never the body, the query or the headers, so no CPF, password or token reaches the log. Health
// and readiness checks, which a container engine and a proxy send every few seconds, are logged
// at debug level.
func logRequests(logger *slog.Logger) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			start := time.Now()
			if err := next(c); err != nil {
				c.Error(err) // write the response now, so the status below is the one sent
			}
			level := slog.LevelInfo
			if p := c.Path(); p == "/healthz" || p == "/readyz" {
				level = slog.LevelDebug
			}
			logger.LogAttrs(c.Request().Context(), level, "request",
				slog.String("method", c.Request().Method),
				slog.String("route", c.Path()),
				slog.Int("status", c.Response().Status),
				slog.Duration("duration", time.Since(start)),
				slog.String("client", c.RealIP()))
			return nil
		}
	}
}
