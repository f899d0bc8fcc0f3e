package httpapi

import (
	"time"

	"github.com/labstack/echo/v4"

	"github.com/pixlimit/pixlimit/internal/auth"
	"github.com/pixlimit/pixlimit/internal/enforce"
)

// addRoutes lists every route of the API. The login is limited inside its handler, because its
// document key comes from the body; PIX and statement are limited per authenticated account
// (never per IP: a whole office shares one), after authentication, before the handler, so a 429
// never reaches the ledger. A PIX is decoded and validated first (a 400 costs no quota), then
// consults the look-up's anti-scan buckets (consultLookups).
func addRoutes(e *echo.Echo, d Deps) error {
	requireAccount := auth.RequireAccount(d.Tokens, d.Tiers.revocations())
	limitPIX, err := limitByAccount(d, d.Limits.PIX, tierLimit(d.Tiers, false))
	if err != nil {
		return err
	}
	limitStatement, err := limitByAccount(d, d.Limits.Statement, tierLimit(d.Tiers, true))
	if err != nil {
		return err
	}
	limitSettings, err := RateLimitConfig{Limiter: d.Limiter, RouteLimit: d.Limits.Settings, Identify: accountDevice,
		FailClosedRetryAfter: d.Limits.FailClosedRetryAfter, Metrics: d.Metrics, Logger: d.Logger}.ToMiddleware()
	if err != nil {
		return err
	}
	// One limiter for the routes that decide in their handlers: the login (its document key comes
	// from the body) and the key look-up (charged after the answer).
	login := limiter{core: d.Limiter, failClosedRetryAfter: d.Limits.FailClosedRetryAfter, metrics: d.Metrics,
		events: newEventLog(d.Logger, 10*time.Second)}

	e.GET("/healthz", handleHealthz())
	e.GET("/openapi.yaml", handleOpenAPI())
	e.GET("/readyz", handleReadyz(d.Probes, d.Limiter, d.Logger))
	e.POST("/v1/login", handleLogin(login, d.Limits, d.Ledger, d.Passwords, d.Tokens, d.Devices, d.Tiers))
	lookups := lookupLimiter{limiter: login, limits: d.Limits, tiers: d.Tiers}
	e.POST("/v1/pix", handlePIX(d.Ledger), requireAccount, decodePIX(), consultLookups(lookups), limitPIX)
	e.GET("/v1/pix/keys/limits", handleLookupLimits(lookups), requireAccount, limitSettings)
	e.GET("/v1/pix/keys/:key", handleLookup(d.Ledger, lookups), requireAccount)
	e.GET("/v1/statement", handleStatement(d.Ledger), requireAccount, limitStatement)
	e.GET("/v1/limits", handleGetLimits(d.Ledger), requireAccount, limitSettings)
	e.PUT("/v1/limits", handlePutLimits(d.Ledger, login, d.Limits.Settings), requireAccount) // limited in the handler: a lowering never is
	e.DELETE("/v1/limits/pending", handleCancelPending(d.Ledger), requireAccount, limitSettings)
	e.POST("/v1/devices/current/register", handleRegisterDevice(login, d.Limits, d.Ledger, d.Passwords, d.DeviceRegistrationDelay),
		requireAccount, limitSettings)
	e.GET("/v1/devices", handleDevices(d.Ledger), requireAccount, limitSettings)
	e.POST("/v1/devices/:device_id/approve", handleApproveDevice(d.Ledger), requireAccount, limitSettings)
	e.DELETE("/v1/devices/:device_id", handleRemoveDevice(d.Ledger, d.Tiers), requireAccount) // never refused: an owner can always cancel
	return nil
}

// accountDevice identifies a request by its access token's account and device: the
// account-settings key.
func accountDevice(c echo.Context) (string, error) {
	s, err := auth.SubjectOf(c)
	if err != nil {
		return "", err
	}
	return s.Account + "/" + s.Device, nil
}

func limitByAccount(d Deps, l enforce.RouteLimit, of func(echo.Context, enforce.RouteLimit) enforce.RouteLimit) (echo.MiddlewareFunc, error) {
	return RateLimitConfig{Limiter: d.Limiter, RouteLimit: l, LimitOf: of, Identify: auth.AccountID,
		FailClosedRetryAfter: d.Limits.FailClosedRetryAfter, Metrics: d.Metrics, Logger: d.Logger}.ToMiddleware()
}
