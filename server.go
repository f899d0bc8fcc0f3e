package pixlimit

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
	"github.com/redis/go-redis/v9"

	"github.com/pixlimit/pixlimit/internal/auth"
	"github.com/pixlimit/pixlimit/internal/config"
	"github.com/pixlimit/pixlimit/internal/pix"
	"github.com/pixlimit/pixlimit/internal/ratelimit"
)

// Pinger is the one Redis call the readiness check needs.
type Pinger interface {
	Ping(ctx context.Context) *redis.StatusCmd
}

// Deps are what a server needs. Replicas of one fleet share Redis (through their Limiters), the
// token secret and the ledger.
type Deps struct {
	Logger  *slog.Logger
	Config  config.Config
	Limiter *ratelimit.Limiter
	Ledger  pix.Ledger
	Tokens  *auth.Tokens
	Redis   Pinger
	// Database, when set, is checked by /readyz too.
	Database interface {
		Ping(ctx context.Context) error
	}
}

// NewServer returns the API's handler.
func NewServer(d Deps) (http.Handler, error) {
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.IPExtractor = auth.IPExtractor(d.Config.TrustedProxies)
	e.HTTPErrorHandler = errorHandler(d.Logger, d.Config.DBTimeout)
	e.Use(
		middleware.Recover(), // a panic becomes a logged 500, never a dropped connection
		logRequests(d.Logger),
		limitBody,
	)
	if err := addRoutes(e, d); err != nil {
		return nil, err
	}
	return e, nil
}

// logRequests logs one line per request: method, route, status, duration and client address.
// Never the body, the query or the headers, so no CPF, password or token reaches the log.
func logRequests(logger *slog.Logger) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			start := time.Now()
			err := next(c)
			if err != nil {
				c.Error(err) // write the response now, so the status below is the one sent
			}
			logger.LogAttrs(c.Request().Context(), slog.LevelInfo, "request",
				slog.String("method", c.Request().Method),
				slog.String("route", c.Path()),
				slog.Int("status", c.Response().Status),
				slog.Duration("duration", time.Since(start)),
				slog.String("client", c.RealIP()))
			return nil
		}
	}
}
