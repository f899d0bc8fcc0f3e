package pixlimit_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pixlimit/pixlimit"
	"github.com/pixlimit/pixlimit/internal/redistest"
)

func TestRedisOutage(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	const budget = 100 * time.Millisecond
	a := startAPI(t, srv, map[string]string{"REDIS_TIMEOUT": budget.String(), "FAIL_CLOSED_RETRY_AFTER": "3s"})
	ana := a.token(demo[0].document, demo[0].password)
	before := a.balance(ana)

	for _, outage := range []struct {
		name     string
		down, up func()
	}{{"killed", srv.Kill, srv.Restart}, {"paused", srv.Pause, srv.Resume}} {
		outage.down()
		within := func(what string, r response) {
			t.Helper()
			// The limiter waits at most the budget; the rest is HTTP on loopback.
			if r.took > budget+150*time.Millisecond {
				t.Errorf("%s, %s: answered in %v, want within the %v budget", outage.name, what, r.took, budget)
			}
		}

		// Login fails closed before the password is looked at: the right password is refused.
		r := a.login(demo[0].document, demo[0].password)
		within("login", r)
		if r.status != http.StatusTooManyRequests || r.json(t)["error"] != "rate_limiter_unavailable" || r.header.Get("Retry-After") != "3" {
			t.Errorf("%s, login: %v %v, want 429 rate_limiter_unavailable with Retry-After 3", outage.name, r, r.header)
		}
		r = a.pix(ana, "bruno@example.com", 100)
		within("PIX", r)
		if r.status != http.StatusTooManyRequests || r.json(t)["error"] != "rate_limiter_unavailable" {
			t.Errorf("%s, PIX: %v, want 429 rate_limiter_unavailable", outage.name, r)
		}
		r = a.statement(ana)
		within("statement", r)
		if r.status != http.StatusOK || r.header.Get("RateLimit-Limit") != "" {
			t.Errorf("%s, statement: %v %v, want 200 without RateLimit headers", outage.name, r, r.header)
		}
		if got := int64(r.json(t)["balance_cents"].(float64)); got != before {
			t.Errorf("%s: balance %d, want %d: a refused PIX moved money", outage.name, got, before)
		}
		r = a.do(http.MethodGet, "/readyz", nil)
		if r.status != http.StatusServiceUnavailable || r.json(t)["redis"] != "down" {
			t.Errorf("%s, readyz: %v, want 503 redis down", outage.name, r)
		}

		outage.up()
		back := time.Now()
		for a.statement(ana).header.Get("RateLimit-Limit") == "" && time.Since(back) < 3*time.Second {
			time.Sleep(20 * time.Millisecond)
		}
		if r := a.pix(ana, "bruno@example.com", 100); r.status != http.StatusCreated || r.header.Get("RateLimit-Remaining") == "" {
			t.Fatalf("%s, Redis back: PIX %v %v, want 201 with RateLimit headers", outage.name, r, r.header)
		}
		before -= 100
		if r := a.login(demo[1].document, demo[1].password); r.status != http.StatusOK {
			t.Fatalf("%s, Redis back: login %v, want 200", outage.name, r)
		}
		if r := a.do(http.MethodGet, "/readyz", nil); r.status != http.StatusOK {
			t.Fatalf("%s, Redis back: readyz %v", outage.name, r)
		}
		t.Logf("%s: limiting resumed %v after Redis came back", outage.name, time.Since(back).Round(time.Millisecond))
	}
	if logs := a.logs.String(); !strings.Contains(logs, `msg="rate limiter unavailable" policy=login-ip fail_mode=closed`) ||
		!strings.Contains(logs, "policy=statement fail_mode=open") {
		t.Errorf("outages not logged per policy and fail mode:\n%s", logs)
	}
}

// TestEmbeddedRedisExpiresKeysOnTime: the embedded default expires a key at its deadline, never
// earlier, whenever within a second it was set (the clock is injected: no sleeping).
func TestEmbeddedRedisExpiresKeysOnTime(t *testing.T) {
	t.Parallel()
	mr, err := pixlimit.StartEmbeddedRedis()
	if err != nil {
		t.Fatal(err)
	}
	defer mr.Shutdown()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	ctx := context.Background()
	start := time.Date(2026, 11, 30, 12, 0, 0, 900_000_000, time.UTC) // 0.9 s into a second
	mr.SetTime(start)
	if err := rdb.Set(ctx, "k", "v", 1500*time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct {
		after time.Duration
		want  int64
	}{{100 * time.Millisecond, 1}, {1499 * time.Millisecond, 1}, {1500 * time.Millisecond, 0}} {
		mr.SetTime(start.Add(step.after))
		if got := rdb.Exists(ctx, "k").Val(); got != step.want {
			t.Errorf("%v after a 1.5 s TTL: exists = %d, want %d", step.after, got, step.want)
		}
	}
}
