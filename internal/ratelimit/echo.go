package ratelimit

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
)

// ErrorBody is the JSON body of a 429.
type ErrorBody struct {
	// Error is "rate_limit_exceeded" when a key is full, "rate_limiter_unavailable" when a
	// fail-closed policy could not decide.
	Error string `json:"error"`
	// Message explains Error to a person.
	Message string `json:"message"`
	// RetryAfterSeconds repeats the Retry-After header.
	RetryAfterSeconds int64 `json:"retry_after_seconds"`
}

// Enforce decides the request in c against checks and prepares the response: it sets the
// RateLimit headers (they stay on whatever the handler answers next, 4xx included) and returns
// nil when the request may proceed, or a 429 *echo.HTTPError, with Retry-After set, when it may
// not. Handlers call it directly when the identity comes from the body, as the login does.
//
// When Redis cannot decide in time the policies' fail modes apply: if any check fails closed the
// request is refused with rate_limiter_unavailable and the configured Retry-After; otherwise it
// proceeds with no RateLimit headers, since nothing was decided. Either way the outage is logged.
func (l *Limiter) Enforce(c echo.Context, checks ...Check) error {
	return l.EnforceReporting(c, nil, checks...)
}

// EnforceReporting is Enforce whose headers report report(d) instead of the whole decision d
// when the request is admitted; a refusal always reports d. The login uses it to report only its
// IP key unless refused, so that nobody reads another person's login activity.
func (l *Limiter) EnforceReporting(c echo.Context, report func(Decision) Decision, checks ...Check) error {
	ctx := c.Request().Context()
	d, err := l.AllowAll(ctx, checks...)
	if err != nil {
		if !errors.Is(err, ErrUnavailable) || ctx.Err() != nil {
			return err // a bad policy, or a client that left: nothing to fail open or closed
		}
		closed := false
		for _, ch := range checks {
			l.outages.failed(ch.Policy, err)
			closed = closed || ch.Policy.FailMode == FailClosed
		}
		if !closed {
			return nil
		}
		return refuse(c, l.retryAfter, "rate_limiter_unavailable",
			"the rate limiter cannot decide right now; try again later", err)
	}
	for _, ch := range checks {
		l.outages.decided(ch.Policy)
	}
	if d.Allowed && report != nil {
		SetHeaders(c.Response().Header(), report(d))
	} else {
		SetHeaders(c.Response().Header(), d)
	}
	if !d.Allowed {
		// The body never names the key that refused: a login refused by its IP key and one refused
		// by its document key read the same.
		return refuse(c, d.RetryAfter, "rate_limit_exceeded",
			"too many requests; retry after the time given", nil)
	}
	return nil
}

// refuse sets Retry-After and returns the 429 for the error handler to write; Echo's default
// handler writes ErrorBody as the JSON body unchanged.
func refuse(c echo.Context, after time.Duration, code, msg string, cause error) error {
	secs := retrySeconds(after)
	c.Response().Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	return &echo.HTTPError{
		Code:     http.StatusTooManyRequests,
		Message:  ErrorBody{Error: code, Message: msg, RetryAfterSeconds: secs},
		Internal: cause,
	}
}

// Config configures the middleware that limits a route by one policy.
type Config struct {
	// Skipper skips the limiter for requests it returns true for. Default: none skipped.
	Skipper middleware.Skipper
	// Limiter decides. Required.
	Limiter *Limiter
	// Policy is the limit applied. Required, and valid (see Policy).
	Policy Policy
	// Identify names the client of a request; its error is returned as is (an
	// *echo.HTTPError such as 401 for a route limited per account). Default: the client IP
	// from c.RealIP, as IPIdentity, which is only as trustworthy as Echo's IPExtractor.
	Identify func(c echo.Context) (string, error)
}

// ToMiddleware validates the configuration and returns the middleware.
func (config Config) ToMiddleware() (echo.MiddlewareFunc, error) {
	if config.Limiter == nil {
		return nil, errors.New("ratelimit: middleware needs a Limiter")
	}
	if err := config.Policy.Validate(); err != nil {
		return nil, fmt.Errorf("ratelimit: middleware: %w", err)
	}
	if config.Skipper == nil {
		config.Skipper = middleware.DefaultSkipper
	}
	if config.Identify == nil {
		config.Identify = identifyByIP
	}
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			if config.Skipper(c) {
				return next(c)
			}
			id, err := config.Identify(c)
			if err != nil {
				return err
			}
			if err := config.Limiter.Enforce(c, Check{Policy: config.Policy, Identity: id}); err != nil {
				return err
			}
			return next(c)
		}
	}, nil
}

func identifyByIP(c echo.Context) (string, error) {
	addr, err := netip.ParseAddr(c.RealIP())
	if err != nil {
		return "", echo.NewHTTPError(http.StatusBadRequest, "cannot tell the client address")
	}
	return IPIdentity(addr), nil
}
