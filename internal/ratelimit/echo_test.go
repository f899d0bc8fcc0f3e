package ratelimit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"

	"github.com/pixlimit/pixlimit/internal/redistest"
)

// syncBuffer is a log sink safe for the concurrent writes of a server.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// limitedServer serves GET /r limited by p, keyed by the X-Account header; the handler answers
// the status in X-Status, so tests see headers on handler errors too.
func limitedServer(t *testing.T, l *Limiter, p Policy) *echo.Echo {
	t.Helper()
	mw, err := Config{
		Limiter:  l,
		Policy:   p,
		Identify: func(c echo.Context) (string, error) { return c.Request().Header.Get("X-Account"), nil },
		Skipper:  func(c echo.Context) bool { return c.Request().Header.Get("X-Skip") != "" },
	}.ToMiddleware()
	if err != nil {
		t.Fatal(err)
	}
	e := echo.New()
	e.GET("/r", func(c echo.Context) error {
		if s := c.Request().Header.Get("X-Status"); s == "400" {
			return echo.NewHTTPError(http.StatusBadRequest, "bad")
		}
		return c.String(http.StatusOK, "ok")
	}, mw)
	return e
}

func get(e *echo.Echo, header ...string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodGet, "/r", nil)
	req.Header.Set("X-Account", "ana")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	rec := httptest.NewRecorder()
	e.ServeHTTP(rec, req)
	return rec
}

func TestMiddleware(t *testing.T) {
	t.Parallel()
	l, _, _ := newTestLimiter(t)
	clk := withClock(l)
	e := limitedServer(t, l, policy("pix", 2, time.Minute))

	rec := get(e)
	if rec.Code != 200 || rec.Header().Get("RateLimit-Remaining") != "1" || rec.Header().Get("RateLimit-Policy") != `"pix";q=2;w=60` {
		t.Fatalf("first: %d %v, want 200 with RateLimit-Remaining 1", rec.Code, rec.Header())
	}
	clk.Add(20 * time.Second)
	rec = get(e, "X-Status", "400")
	if rec.Code != 400 || rec.Header().Get("RateLimit-Remaining") != "0" || rec.Header().Get("RateLimit-Reset") != "40" {
		t.Fatalf("handler 400: %d %v, want the RateLimit headers kept (remaining 0, reset 40)", rec.Code, rec.Header())
	}
	rec = get(e)
	if rec.Code != http.StatusTooManyRequests {
		t.Fatalf("third: %d, want 429", rec.Code)
	}
	var body ErrorBody
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatalf("429 body %q: %v", rec.Body, err)
	}
	if want := (ErrorBody{Error: "rate_limit_exceeded", Message: body.Message, RetryAfterSeconds: 40}); body != want || body.Message == "" {
		t.Errorf("429 body = %+v, want %+v", body, want)
	}
	if got, want := rec.Header().Get("Retry-After"), "40"; got != want || rec.Header().Get("RateLimit-Reset") != want {
		t.Errorf("Retry-After = %q, RateLimit-Reset = %q, want both %q", got, rec.Header().Get("RateLimit-Reset"), want)
	}
	if got := get(e, "X-Account", "bruno").Code; got != 200 {
		t.Errorf("another account: %d, want 200 (the key is the account)", got)
	}
	if rec := get(e, "X-Skip", "1"); rec.Code != 200 || rec.Header().Get("RateLimit-Limit") != "" {
		t.Errorf("skipped: %d %v, want 200 without RateLimit headers", rec.Code, rec.Header())
	}
}

func TestMiddlewareConfigErrors(t *testing.T) {
	l, _, _ := newTestLimiter(t)
	for name, cfg := range map[string]Config{
		"no limiter": {Policy: policy("pix", 1, time.Second)},
		"no policy":  {Limiter: l},
		"bad window": {Limiter: l, Policy: policy("pix", 1, time.Microsecond)},
		"bad name":   {Limiter: l, Policy: policy("PIX!", 1, time.Second)},
		"zero limit": {Limiter: l, Policy: policy("pix", 0, time.Second)},
	} {
		if _, err := cfg.ToMiddleware(); err == nil {
			t.Errorf("%s: ToMiddleware returned no error", name)
		}
	}
}

func TestFailModes(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	var logs syncBuffer
	c := srv.Client(func(o *redis.Options) { ClientOptions(o, budget) })
	l, err := New(c, Options{KeySecret: testSecret, Timeout: budget, FailClosedRetryAfter: 7 * time.Second,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)), OutageLogEvery: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	closed := limitedServer(t, l, Policy{Name: "pix", Limit: 100, Window: time.Minute, FailMode: FailClosed})
	open := limitedServer(t, l, Policy{Name: "statement", Limit: 100, Window: time.Minute, FailMode: FailOpen})
	if get(closed).Code != 200 || get(open).Code != 200 {
		t.Fatal("not serving before the outage")
	}

	for _, stop := range []struct {
		name     string
		down, up func()
	}{{"killed", srv.Kill, srv.Restart}, {"paused", srv.Pause, srv.Resume}} {
		stop.down()
		for range 10 {
			start := time.Now()
			rec := get(closed)
			if elapsed := time.Since(start); elapsed > budget+50*time.Millisecond {
				t.Errorf("%s, fail closed: answered in %v, want within %v", stop.name, elapsed, budget)
			}
			var body ErrorBody
			_ = json.Unmarshal(rec.Body.Bytes(), &body)
			if rec.Code != 429 || body.Error != "rate_limiter_unavailable" || body.RetryAfterSeconds != 7 || rec.Header().Get("Retry-After") != "7" {
				t.Fatalf("%s, fail closed: %d %s %v, want 429 rate_limiter_unavailable, Retry-After 7", stop.name, rec.Code, rec.Body, rec.Header())
			}
			if rec.Header().Get("RateLimit-Limit") != "" {
				t.Errorf("%s, fail closed: RateLimit headers on an undecided request", stop.name)
			}

			start = time.Now()
			rec = get(open)
			if elapsed := time.Since(start); elapsed > budget+50*time.Millisecond {
				t.Errorf("%s, fail open: answered in %v, want within %v", stop.name, elapsed, budget)
			}
			if rec.Code != 200 || rec.Header().Get("RateLimit-Limit") != "" {
				t.Fatalf("%s, fail open: %d %v, want 200 without RateLimit headers", stop.name, rec.Code, rec.Header())
			}
		}
		stop.up()
		// After failed dials go-redis's pool fails fast and redials in the background once a
		// second, so limiting resumes within about a second, without a restart.
		back := time.Now()
		rec := get(closed)
		for rec.Code != 200 && time.Since(back) < 3*time.Second {
			time.Sleep(20 * time.Millisecond)
			rec = get(closed)
		}
		if rec.Code != 200 || rec.Header().Get("RateLimit-Limit") != "100" {
			t.Fatalf("%s, back up: %d %v, want 200 with RateLimit headers within 3s", stop.name, rec.Code, rec.Header())
		}
		t.Logf("%s: limiting resumed %v after Redis came back", stop.name, time.Since(back).Round(time.Millisecond))
		get(open)
	}

	out := logs.String()
	// Two outages × two policies, each logged once (throttled), each recovery once.
	if got := strings.Count(out, `msg="rate limiter unavailable"`); got != 4 {
		t.Errorf("%d outage reports for 2 outages × 2 policies × 10 requests, want 4 (throttled):\n%s", got, out)
	}
	if got := strings.Count(out, `msg="rate limiter recovered"`); got != 4 {
		t.Errorf("%d recovery reports, want 4:\n%s", got, out)
	}
	if !strings.Contains(out, "policy=pix fail_mode=closed") || !strings.Contains(out, "policy=statement fail_mode=open") {
		t.Errorf("outage reports do not name policy and fail mode:\n%s", out)
	}
}

func TestClientThatLeftIsNotAnOutage(t *testing.T) {
	t.Parallel()
	l, _, _ := newTestLimiter(t)
	e := limitedServer(t, l, policy("pix", 2, time.Minute))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	req := httptest.NewRequest(http.MethodGet, "/r", nil).WithContext(ctx)
	req.Header.Set("X-Account", "ana")
	c := e.NewContext(req, httptest.NewRecorder())
	err := l.Enforce(c, Check{policy("pix", 2, time.Minute), "ana"})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Enforce for a client that left: %v, want context.Canceled (neither fail open nor closed)", err)
	}
}
