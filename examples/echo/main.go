// Command echo is the smallest service that limits a route with pixlimit's limiter: GET /hello,
// 5 a minute per client IP, exact across every replica that shares its Redis and KEY_SECRET. Copy
// it and internal/ratelimit; the rest of pixlimit is not needed.
//
//	REDIS_URL=redis://localhost:6379 KEY_SECRET=$(openssl rand -hex 16) go run ./examples/echo
package main

import (
	"errors"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"

	"github.com/pixlimit/pixlimit/internal/ratelimit"
)

func main() {
	opt, err := redis.ParseURL(os.Getenv("REDIS_URL"))
	if err != nil {
		panic(err)
	}
	ratelimit.ClientOptions(opt, 100*time.Millisecond) // every wait ends by the decision's budget
	e, err := newServer(redis.NewClient(opt), []byte(os.Getenv("KEY_SECRET")))
	if err != nil {
		panic(err)
	}
	e.Logger.Fatal(e.Start(":8080"))
}

// newServer serves GET /hello, limited per client IP. Every replica gives the same secret.
func newServer(rdb redis.Scripter, secret []byte) (*echo.Echo, error) {
	l, err := ratelimit.New(rdb, ratelimit.Options{KeySecret: secret, Timeout: 100 * time.Millisecond})
	if err != nil {
		return nil, err
	}
	hello := ratelimit.Policy{Name: "hello", Limit: 5, Window: time.Minute}
	e := echo.New()
	// The client is the connection's peer: a header anyone can write must not pick the key. Behind
	// your proxy, echo.ExtractIPFromXFFHeader(echo.TrustIPRange(itsNetwork)) instead.
	e.IPExtractor = echo.ExtractIPDirect()
	e.GET("/hello", func(c echo.Context) error { return c.String(http.StatusOK, "hello\n") }, limit(l, hello))
	return e, nil
}

// limit decides each request against p for its client IP: RateLimit headers on every answer,
// 429 with Retry-After when refused, and 503 (fail closed) when Redis cannot decide in time.
func limit(l *ratelimit.Limiter, p ratelimit.Policy) echo.MiddlewareFunc {
	seconds := func(d time.Duration) string { return strconv.FormatInt(int64((d+time.Second-1)/time.Second), 10) }
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			addr, err := netip.ParseAddr(c.RealIP())
			if err != nil {
				return echo.NewHTTPError(http.StatusBadRequest, "no client address")
			}
			d, err := l.AllowAll(c.Request().Context(), ratelimit.Check{Policy: p, Identity: ratelimit.IPIdentity(addr)})
			if errors.Is(err, ratelimit.ErrUnavailable) && c.Request().Context().Err() == nil { // not a client that left
				c.Response().Header().Set("Retry-After", "5")
				return echo.NewHTTPError(http.StatusServiceUnavailable, "rate limiter unavailable")
			} else if err != nil {
				return err
			}
			h := c.Response().Header()
			h.Set("RateLimit-Limit", strconv.Itoa(d.Worst.Capacity))
			h.Set("RateLimit-Remaining", strconv.Itoa(d.Worst.Remaining))
			h.Set("RateLimit-Reset", seconds(d.Worst.Reset))
			if !d.Allowed {
				h.Set("Retry-After", seconds(d.Worst.RetryAfter))
				return c.JSON(http.StatusTooManyRequests, map[string]string{"error": "rate_limit_exceeded"})
			}
			return next(c)
		}
	}
}
