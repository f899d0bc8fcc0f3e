package httpapi

import (
	"cmp"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/pixlimit/pixlimit/internal/auth"
	"github.com/pixlimit/pixlimit/internal/pix"
)

// addRoutes lists every route of the API. Echo takes a route's middleware after its handler,
// and runs it first, in the order listed: /v1/pix/keys/limits runs requireAccount, then
// limitSettings, then handleLookupLimits. (Groups would list it first, but a group's middleware
// also runs for every unknown path under it: a 404 would become a 401.) Each handler then tells
// its request's story itself, its limits included (a PIX: handlePIX).
//
// Every route a client can call is limited, but what a replica answers from memory, reading and
// writing nothing: the probes, the OpenAPI document and an OPTIONS (edge logs them at debug
// level; a malformed request, answered before its limit, is logged in summaries: summarized). The login decides its IP and document keys in its
// handler (the document comes from the body); PIX and statement decide per authenticated account
// (never per IP: a whole office shares one) in theirs, after validating the request, so a 400
// costs no quota and a 429 never reaches the ledger; the settings routes share one bucket per
// account and device (account-settings), as a middleware, or in their handlers when they decide
// it once their body is valid (PUT /v1/limits) or with another key (a registration's guesses).
func addRoutes(e *echo.Echo, d Deps) error {
	requireAccount := auth.RequireAccount(d.Tokens, revocations(d.Tiers)) // an access token, not revoked
	limitSettings, err := RateLimitConfig{Limiter: d.Limiter, Stack: d.Stack, Fallback: d.Fallback,
		RouteLimit: d.Limits.Settings, Identify: accountDevice,
		FailClosedRetryAfter: d.Limits.FailClosedRetryAfter, Metrics: d.Metrics, Logger: d.Logger}.ToMiddleware()
	if err != nil {
		return err
	}
	// One limiter for the routes that decide in their handlers.
	decide := limiter{core: d.Limiter, stack: d.Stack, cache: d.DenyCache, queue: d.Queue, fallback: d.Fallback, failClosedRetryAfter: d.Limits.FailClosedRetryAfter, metrics: d.Metrics,
		events: newEventLog(d.Logger, 10*time.Second), maxWait: d.Limits.MaxWait, budget: d.Limits.Budget, retry: d.Releases}
	dictBuckets := newBuckets(decide, d.Limits, d.Tiers) // a look-up and a PIX pay them

	// The probes answer HEAD too (the status alone): a load balancer may check with it.
	healthz, readyz := handleHealthz(), handleReadyz(d.Probes, d.Breaker, d.Logger)
	e.GET("/healthz", healthz)
	e.HEAD("/healthz", healthz)
	if len(d.OpenAPI) > 0 {
		e.GET("/openapi.yaml", handleOpenAPI(d.OpenAPI))
	}
	e.GET("/readyz", readyz)
	e.HEAD("/readyz", readyz)
	e.POST("/v1/login", handleLogin(decide, d.Limits, d.Ledger, d.Passwords, d.Tokens, d.Devices, d.Tiers))

	// A PIX waits for its key's original at most the longest transfer (LedgerRetryAfter is the
	// ledger's deadline), within what the write timeout leaves.
	maxWait := cmp.Or(d.Limits.MaxWait, defaultMaxWait)
	originals := newOriginals(min(maxWait, pix.LongestTransfer(d.LedgerRetryAfter)))
	e.POST("/v1/pix", handlePIX(d.Ledger, d.Share, originals, maxWait, newAdmissions(dictBuckets, d.Limits.PIX, d.Limits.PIXConcurrency)), requireAccount)
	e.GET("/v1/pix/keys/:key", handleLookup(d.Ledger, d.Share, dictBuckets), requireAccount)
	e.GET("/v1/statement", handleStatement(d.Ledger, decide, d.Limits.Statement, d.Tiers), requireAccount)
	e.PUT("/v1/limits", handlePutLimits(d.Ledger, decide, d.Limits.Settings), requireAccount) // limited in the handler, once the body is valid
	e.DELETE("/v1/devices/:device_id", handleRemoveDevice(d.Ledger, d.Tiers), requireAccount, limitSettings)

	e.GET("/v1/pix/keys/limits", handleLookupLimits(dictBuckets), requireAccount, limitSettings)
	e.GET("/v1/limits", handleGetLimits(d.Ledger), requireAccount, limitSettings)
	e.DELETE("/v1/limits/pending", handleCancelPending(d.Ledger), requireAccount, limitSettings)
	e.POST("/v1/devices/current/register", handleRegisterDevice(decide, d.Limits, d.Ledger, d.Passwords, d.DeviceRegistrationDelay),
		requireAccount) // limited in the handler: its guesses and account-settings in one call
	e.GET("/v1/devices", handleDevices(d.Ledger), requireAccount, limitSettings)
	e.POST("/v1/devices/:device_id/approve", handleApproveDevice(d.Ledger), requireAccount, limitSettings)
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
