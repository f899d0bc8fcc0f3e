package pixlimit

import (
	"github.com/labstack/echo/v4"

	"github.com/pixlimit/pixlimit/internal/auth"
	"github.com/pixlimit/pixlimit/internal/ratelimit"
)

// addRoutes lists every route of the API. The login is limited inside its handler, because its
// document key comes from the body; PIX and statement are limited per authenticated account
// (never per IP: a whole office shares one), after authentication, before the handler, so a 429
// never reaches the ledger.
func addRoutes(e *echo.Echo, d Deps) error {
	requireAccount := auth.RequireAccount(d.Tokens)
	limitPIX, err := limitByAccount(d.Limiter, d.Config.PIX)
	if err != nil {
		return err
	}
	limitStatement, err := limitByAccount(d.Limiter, d.Config.Statement)
	if err != nil {
		return err
	}

	e.GET("/healthz", handleHealthz())
	e.GET("/readyz", handleReadyz(d.Redis, d.Database, d.Config.RedisTimeout))
	e.POST("/v1/login", handleLogin(d.Limiter, d.Config.LoginIP, d.Config.LoginAccount, d.Ledger, d.Tokens))
	e.POST("/v1/pix", handlePIX(d.Ledger), requireAccount, limitPIX)
	e.GET("/v1/statement", handleStatement(d.Ledger), requireAccount, limitStatement)
	return nil
}

func limitByAccount(l *ratelimit.Limiter, p ratelimit.Policy) (echo.MiddlewareFunc, error) {
	return ratelimit.Config{Limiter: l, Policy: p, Identify: auth.AccountID}.ToMiddleware()
}
