package httpapi_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pixlimit/pixlimit/internal/auth"
	"github.com/pixlimit/pixlimit/internal/enforce"
	"github.com/pixlimit/pixlimit/internal/ratelimit"
	"github.com/pixlimit/pixlimit/internal/testing/apitest"
	"github.com/pixlimit/pixlimit/internal/testing/redistest"
)

// TestRedisCallsPerRequest counts the script calls each request makes on one Redis, as Redis
// counts them (INFO commandstats: EVALSHA and EVAL), with the default algorithms: an admitted PIX
// costs 2 (its look-up buckets asked and its own limit decided in one; then the buckets settled:
// a look-up redeemed and refunded, or a miss charged), a PIX refused by a limit 1 (0 once the
// replica knows the key is full), a key look-up 2, a login and a statement 1. The same with the
// in-flight slot on (PIX_CONCURRENCY, on by default): the slot rides in the PIX's two calls.
func TestRedisCallsPerRequest(t *testing.T) {
	t.Parallel()
	for _, slots := range []int{0, 2} {
		t.Run(fmt.Sprint("PIX_CONCURRENCY=", slots), func(t *testing.T) {
			t.Parallel()
			limits := lax()
			limits.PIX = enforce.RouteLimit{Policy: ratelimit.Policy{Name: "pix", Limit: 4, Window: time.Minute}}
			if slots > 0 {
				limits.PIXConcurrency = enforce.RouteLimit{Policy: ratelimit.Policy{Name: "pix-concurrency", Limit: slots, Window: 10 * time.Second}}
			}
			countCalls(t, limits)
		})
	}
	t.Run("PIX_MODE=shadow", func(t *testing.T) { // its slot and price before its limit, after the buckets' ask
		t.Parallel()
		limits := lax()
		limits.PIX.Shadow = true
		limits.PIXConcurrency = enforce.RouteLimit{Policy: ratelimit.Policy{Name: "pix-concurrency", Limit: 2, Window: 10 * time.Second}}
		srv := redistest.Start(t)
		s := newServerWith(t, srv, limits, ratelimit.Options{}, true) // no deny cache: Redis refuses
		calls := scriptCalls(t, srv.Client(nil))
		token, err := s.tokens.Issue(auth.Subject{Account: "acct-diego", Payer: s.tokens.PayerID("93541134780"), Person: "PF", Device: "phone"})
		if err != nil {
			t.Fatal(err)
		}
		send := func(method, path, body string) int {
			req := httptest.NewRequest(method, path, strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer "+token)
			req.Header.Set("Idempotency-Key", apitest.NewIdempotencyKey())
			rec := httptest.NewRecorder()
			s.h.ServeHTTP(rec, req)
			return rec.Code
		}
		pix := func() int { return send(http.MethodPost, "/v1/pix", `{"key":"bruno@example.com","amount_cents":100}`) }
		pix()              // every script loaded
		for i := range 5 { // Diego's look-up bucket emptied
			send(http.MethodGet, fmt.Sprintf("/v1/pix/keys/ghost%d@example.com", i), "")
		}
		before := calls()
		if status, got := pix(), calls()-before; status != http.StatusTooManyRequests || got != 1 {
			t.Errorf("a shadow-limited PIX its bucket refuses: %d after %d script calls, want 429 after 1 (nothing taken)", status, got)
		}
	})
}

// scriptCalls counts the scripts rdb's Redis has run (EVALSHA and EVAL, from INFO commandstats).
func scriptCalls(t *testing.T, rdb *redis.Client) func() int {
	return func() int {
		info, err := rdb.Info(context.Background(), "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, line := range strings.Split(info, "\r\n") {
			name, stats, ok := strings.Cut(line, ":")
			if !ok || name != "cmdstat_evalsha" && name != "cmdstat_eval" {
				continue
			}
			calls, _, _ := strings.Cut(strings.TrimPrefix(stats, "calls="), ",")
			c, _ := strconv.Atoi(calls)
			n += c
		}
		return n
	}
}

// countCalls is TestRedisCallsPerRequest over limits.
func countCalls(t *testing.T, limits enforce.RouteLimits) {
	srv := redistest.Start(t)
	s := newServer(t, srv, limits)
	token, err := s.tokens.Issue(auth.Subject{Account: "acct-diego", Payer: s.tokens.PayerID("93541134780"), Person: "PF", Device: "phone"})
	if err != nil {
		t.Fatal(err)
	}
	scriptCalls := scriptCalls(t, srv.Client(nil))
	send := func(method, path, body string, header ...string) int {
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+token)
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		rec := httptest.NewRecorder()
		s.h.ServeHTTP(rec, req)
		return rec.Code
	}
	n := 0
	pix := func(key string) int {
		n++
		return send(http.MethodPost, "/v1/pix", fmt.Sprintf(`{"key":%q,"amount_cents":100}`, key), "Idempotency-Key", fmt.Sprint("calls-", n))
	}
	login := func() int {
		return send(http.MethodPost, "/v1/login", `{"document":"93541134780","password":"wrong"}`)
	}
	// Every script loaded once (a first call is EVALSHA, NOSCRIPT, then EVAL); two PIX of the 4.
	send(http.MethodGet, "/v1/pix/keys/carla@example.com", "")
	pix("carla@example.com")
	pix("nobody@example.com")
	send(http.MethodGet, "/v1/statement", "")
	login()

	for _, tt := range []struct {
		name       string
		do         func() int
		wantStatus int
		wantCalls  int
	}{
		{"a key look-up", func() int { return send(http.MethodGet, "/v1/pix/keys/bruno@example.com", "") }, http.StatusOK, 2},
		{"a PIX to the key looked up: admitted, the look-up refunded", func() int { return pix("bruno@example.com") }, http.StatusCreated, 2},
		{"a PIX to a key nobody has: admitted, the miss charged", func() int { return pix("nobody@example.com") }, http.StatusNotFound, 2},
		{"a PIX refused by its limit", func() int { return pix("bruno@example.com") }, http.StatusTooManyRequests, 1},
		{"a PIX refused again, from the replica's memory of the full key", func() int { return pix("bruno@example.com") }, http.StatusTooManyRequests, 0},
		{"a statement", func() int { return send(http.MethodGet, "/v1/statement", "") }, http.StatusOK, 1},
		{"a login", login, http.StatusUnauthorized, 1},
	} {
		before := scriptCalls()
		status := tt.do()
		got := scriptCalls() - before
		if status != tt.wantStatus || got != tt.wantCalls {
			t.Errorf("%s: %d after %d script calls, want %d after %d", tt.name, status, got, tt.wantStatus, tt.wantCalls)
		}
	}
}
