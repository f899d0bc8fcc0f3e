// Package pixlimit is a Go reference implementation of a PIX banking API whose rate limiting is
// fleet-wide, exact and honest. The program is cmd/api; the demo, cmd/demo. The packages below
// own one concern each:
//
//   - internal/ratelimit: the limiter, its algorithms and their Lua scripts (no HTTP);
//   - internal/httpapi: routes, handlers, RateLimit headers, the middleware and the error mapping;
//   - internal/auth: who is asking (client IP, passwords, tokens); internal/pix: the money;
//   - internal/config: the environment; internal/memredis: the embedded Redis.
//
// This package holds this documentation, the OpenAPI documents of the contract (docs/, embedded
// here for the API to serve and the tests to check against) and integration_test.go: several
// replicas built from those public pieces, over one real Redis, holding every limit together.
package pixlimit
