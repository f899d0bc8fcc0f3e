package main

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pixlimit/pixlimit/internal/apitest"
	"github.com/pixlimit/pixlimit/internal/redistest"
)

func TestRedisOutage(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	const budget = 100 * time.Millisecond
	a := startAPI(t, srv, map[string]string{"REDIS_TIMEOUT": budget.String(), "FAIL_CLOSED_RETRY_AFTER": "3s"})
	ana := a.Token(demo[0].Document, demo[0].Password)
	before := a.Balance(ana)

	for _, outage := range []struct {
		name     string
		down, up func()
	}{{"killed", srv.Kill, srv.Restart}, {"paused", srv.Pause, srv.Resume}} {
		outage.down()
		within := func(what string, r apitest.Response) {
			t.Helper()
			// The limiter waits at most the budget; the rest is HTTP on loopback.
			if r.Took > budget+150*time.Millisecond {
				t.Errorf("%s, %s: answered in %v, want within the %v budget", outage.name, what, r.Took, budget)
			}
		}

		// Login fails closed before the password is looked at: the right password is refused.
		r := a.Login(demo[0].Document, demo[0].Password)
		within("login", r)
		if r.Status != http.StatusTooManyRequests || r.JSON(t)["error"] != "rate_limiter_unavailable" || r.Header.Get("Retry-After") != "3" {
			t.Errorf("%s, login: %v %v, want 429 rate_limiter_unavailable with Retry-After 3", outage.name, r, r.Header)
		}
		r = a.PIX(ana, "bruno@example.com", 100)
		within("PIX", r)
		if r.Status != http.StatusTooManyRequests || r.JSON(t)["error"] != "rate_limiter_unavailable" {
			t.Errorf("%s, PIX: %v, want 429 rate_limiter_unavailable", outage.name, r)
		}
		r = a.Statement(ana)
		within("statement", r)
		if r.Status != http.StatusOK || r.Header.Get("RateLimit-Limit") != "" {
			t.Errorf("%s, statement: %v %v, want 200 without RateLimit headers", outage.name, r, r.Header)
		}
		if got := int64(r.JSON(t)["balance_cents"].(float64)); got != before {
			t.Errorf("%s: balance %d, want %d: a refused PIX moved money", outage.name, got, before)
		}
		r = a.Do(http.MethodGet, "/readyz", nil)
		if r.Status != http.StatusServiceUnavailable || r.JSON(t)["redis"] != "down" {
			t.Errorf("%s, readyz: %v, want 503 redis down", outage.name, r)
		}

		outage.up()
		back := time.Now()
		for a.Statement(ana).Header.Get("RateLimit-Limit") == "" && time.Since(back) < 3*time.Second {
			time.Sleep(20 * time.Millisecond)
		}
		if r := a.PIX(ana, "bruno@example.com", 100); r.Status != http.StatusCreated || r.Header.Get("RateLimit-Remaining") == "" {
			t.Fatalf("%s, Redis back: PIX %v %v, want 201 with RateLimit headers", outage.name, r, r.Header)
		}
		before -= 100
		if r := a.Login(demo[1].Document, demo[1].Password); r.Status != http.StatusOK {
			t.Fatalf("%s, Redis back: login %v, want 200", outage.name, r)
		}
		if r := a.Do(http.MethodGet, "/readyz", nil); r.Status != http.StatusOK {
			t.Fatalf("%s, Redis back: readyz %v", outage.name, r)
		}
		t.Logf("%s: limiting resumed %v after Redis came back", outage.name, time.Since(back).Round(time.Millisecond))
	}
	if logs := a.logs.String(); !strings.Contains(logs, `msg="rate limiter unavailable" policy=login-ip fail_mode=closed`) ||
		!strings.Contains(logs, "policy=statement fail_mode=open") {
		t.Errorf("outages not logged per policy and fail mode:\n%s", logs)
	}
}
