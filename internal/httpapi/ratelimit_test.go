package httpapi

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"

	"github.com/pixlimit/pixlimit/internal/enforce"
	"github.com/pixlimit/pixlimit/internal/ratelimit"
	"github.com/pixlimit/pixlimit/internal/ratelimit/outages"
	"github.com/pixlimit/pixlimit/internal/testing/apitest"
	"github.com/pixlimit/pixlimit/internal/testing/redistest"
	"github.com/pixlimit/pixlimit/internal/testing/stalls"
)

// budget is the decision budget of the fail-mode test, which measures it.
const budget = 100 * time.Millisecond

func newLimiter(t *testing.T, srv *redistest.Server, timeout time.Duration) *ratelimit.Limiter {
	t.Helper()
	c := srv.Client(func(o *redis.Options) { ratelimit.ClientOptions(o, timeout) })
	l, err := ratelimit.New(c, ratelimit.Options{KeySecret: []byte(rand.Text()), Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func policy(name string, limit int, window time.Duration) ratelimit.Policy {
	return ratelimit.Policy{Name: name, Limit: limit, Window: window}
}

// limitedServer serves GET /r limited by p, keyed by the X-Account header, with the API's error
// handler; the handler answers 400 when asked by X-Status, so tests see headers on handler
// errors too. The logger, if given, hears the fail modes and, as a replica's does, the outages
// (package outages, in front of l).
func limitedServer(t *testing.T, l *ratelimit.Limiter, p enforce.RouteLimit, logger ...*slog.Logger) *echo.Echo {
	t.Helper()
	lg := append(logger, slog.New(slog.DiscardHandler))[0]
	mw, err := RateLimitConfig{
		Limiter:              l,
		Stack:                outages.New(l, outages.Options{Logger: lg, Every: time.Hour}),
		RouteLimit:           p,
		Logger:               lg,
		Identify:             func(c echo.Context) (string, error) { return c.Request().Header.Get("X-Account"), nil },
		Skipper:              func(c echo.Context) bool { return c.Request().Header.Get("X-Skip") != "" },
		FailClosedRetryAfter: 7 * time.Second,
	}.ToMiddleware()
	if err != nil {
		t.Fatal(err)
	}
	e := echo.New()
	e.HTTPErrorHandler = errorHandler(slog.New(slog.DiscardHandler), time.Second)
	e.GET("/r", func(c echo.Context) error {
		if s := c.Request().Header.Get("X-Status"); s == "400" {
			return invalid("bad", nil)
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
	e := limitedServer(t, newLimiter(t, redistest.Start(t), time.Second), enforce.RouteLimit{Policy: policy("pix", 2, time.Minute)})

	rec := get(e)
	if rec.Code != 200 || rec.Header().Get("RateLimit-Remaining") != "1" || rec.Header().Get("RateLimit-Policy") != `"pix";q=2;w=60` {
		t.Fatalf("first: %d %v, want 200 with RateLimit-Remaining 1", rec.Code, rec.Header())
	}
	rec = get(e, "X-Status", "400")
	if rec.Code != 400 || rec.Header().Get("RateLimit-Remaining") != "0" || rec.Header().Get("RateLimit-Reset") != "60" {
		t.Fatalf("handler 400: %d %v, want the RateLimit headers kept (remaining 0, reset 60)", rec.Code, rec.Header())
	}
	rec = get(e)
	if rec.Code != http.StatusTooManyRequests {
		t.Fatalf("third: %d, want 429", rec.Code)
	}
	var body errorBody
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatalf("429 body %q: %v", rec.Body, err)
	}
	if body.Error != "rate_limit_exceeded" || body.Message == "" || body.RetryAfterSeconds != 60 || body.Fields != nil {
		t.Errorf("429 body = %+v, want rate_limit_exceeded, a message, retry_after_seconds 60", body)
	}
	if got, want := rec.Header().Get("Retry-After"), "60"; got != want || rec.Header().Get("RateLimit-Reset") != want {
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
	t.Parallel()
	l := newLimiter(t, redistest.Start(t), time.Second)
	for name, cfg := range map[string]RateLimitConfig{
		"no limiter": {RouteLimit: enforce.RouteLimit{Policy: policy("pix", 1, time.Second)}},
		"no policy":  {Limiter: l},
		"bad window": {Limiter: l, RouteLimit: enforce.RouteLimit{Policy: policy("pix", 1, time.Microsecond)}},
		"bad name":   {Limiter: l, RouteLimit: enforce.RouteLimit{Policy: policy("PIX!", 1, time.Second)}},
		"zero limit": {Limiter: l, RouteLimit: enforce.RouteLimit{Policy: policy("pix", 0, time.Second)}},
	} {
		if _, err := cfg.ToMiddleware(); err == nil {
			t.Errorf("%s: ToMiddleware returned no error", name)
		}
	}
}

func TestFailModes(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	var logs apitest.Logs
	l := newLimiter(t, srv, budget)
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	closed := limitedServer(t, l, enforce.RouteLimit{Policy: policy("pix", 100, time.Minute), FailMode: enforce.FailClosed}, logger)
	meter := stalls.Watch(t) // a loaded runner's stalls are not the budget's
	open := limitedServer(t, l, enforce.RouteLimit{Policy: policy("statement", 100, time.Minute), FailMode: enforce.FailOpen}, logger)
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
			if elapsed := meter.Took(start); elapsed > budget+50*time.Millisecond {
				t.Errorf("%s, fail closed: answered in %v, want within %v", stop.name, elapsed, budget)
			}
			var body errorBody
			_ = json.Unmarshal(rec.Body.Bytes(), &body)
			if rec.Code != 429 || body.Error != "rate_limiter_unavailable" || body.RetryAfterSeconds != 7 || rec.Header().Get("Retry-After") != "7" {
				t.Fatalf("%s, fail closed: %d %s %v, want 429 rate_limiter_unavailable, Retry-After 7", stop.name, rec.Code, rec.Body, rec.Header())
			}
			if rec.Header().Get("RateLimit-Limit") != "" {
				t.Errorf("%s, fail closed: RateLimit headers on an undecided request", stop.name)
			}

			start = time.Now()
			rec = get(open)
			if elapsed := meter.Took(start); elapsed > budget+50*time.Millisecond {
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
	var logs apitest.Logs
	l := newLimiter(t, redistest.Start(t), time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	req := httptest.NewRequest(http.MethodGet, "/r", nil).WithContext(ctx)
	c := echo.New().NewContext(req, httptest.NewRecorder())
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	err := limiter{core: l, stack: outages.New(l, outages.Options{Logger: logger}), events: newEventLog(logger, time.Hour)}.enforce(c, nil, checkOf(enforce.RouteLimit{Policy: policy("pix", 2, time.Minute)}, "ana"))
	if !errors.Is(err, context.Canceled) {
		t.Errorf("enforce for a client that left: %v, want context.Canceled (neither fail open nor closed)", err)
	}
	if strings.Contains(logs.String(), "unavailable") {
		t.Errorf("a client that left was logged as an outage:\n%s", logs.String())
	}
}

func TestSetHeaders(t *testing.T) {
	t.Parallel()
	pix := policy("pix", 10, time.Minute)
	ip, doc := policy("login-ip", 10, 10*time.Minute), policy("login-account", 5, 10*time.Minute)
	bucket := ratelimit.Policy{Name: "pix", Limit: 10, Window: time.Minute, Algorithm: ratelimit.TokenBucket, Burst: 20}
	tests := []struct {
		name string
		d    ratelimit.Decision
		want map[string]string
	}{
		{
			name: "allowed",
			d:    decision(true, ratelimit.Result{Policy: pix, Capacity: 10, Remaining: 7, Reset: 41*time.Second + time.Millisecond}),
			want: map[string]string{
				"RateLimit-Limit": "10", "RateLimit-Remaining": "7", "RateLimit-Reset": "42",
				"RateLimit-Policy": `"pix";q=10;w=60`, "RateLimit": `"pix";r=7;t=42`,
			},
		},
		{
			name: "refused: rounded up",
			d:    decision(false, ratelimit.Result{Policy: pix, Capacity: 10, Reset: 2500 * time.Millisecond, RetryAfter: 2500 * time.Millisecond}),
			want: map[string]string{"RateLimit-Remaining": "0", "RateLimit-Reset": "3", "RateLimit": `"pix";r=0;t=3`},
		},
		{
			name: "every in-flight slot held: a quota of requests in progress, no window, beside the PIX's own",
			d: decision(false, ratelimit.Result{Policy: pix, Capacity: 10, Remaining: 9},
				ratelimit.Result{Policy: ratelimit.Policy{Name: "pix-concurrency", Limit: 2}, Capacity: 2, Reset: time.Second, RetryAfter: time.Second}),
			want: map[string]string{"RateLimit-Limit": "2", "RateLimit-Remaining": "0", "RateLimit-Reset": "1",
				"RateLimit-Policy": `"pix";q=10;w=60, "pix-concurrency";q=2;qu="concurrent-requests"`, "RateLimit": `"pix-concurrency";r=0;t=1`},
		},
		{
			name: "a bucket: Limit is the burst, the policy says both",
			d:    decision(true, ratelimit.Result{Policy: bucket, Capacity: 20, Remaining: 19, Reset: 6 * time.Second}),
			want: map[string]string{"RateLimit-Limit": "20", "RateLimit-Policy": `"pix";q=10;w=60;pixlimit-burst=20`},
		},
		{
			name: "login: both policies listed, the worst reported",
			d: decision(false,
				ratelimit.Result{Policy: ip, Capacity: 10, Remaining: 4, Reset: 300 * time.Second},
				ratelimit.Result{Policy: doc, Capacity: 5, Reset: 120 * time.Second, RetryAfter: 120 * time.Second}),
			want: map[string]string{
				"RateLimit-Limit": "5", "RateLimit-Remaining": "0", "RateLimit-Reset": "120",
				"RateLimit-Policy": `"login-ip";q=10;w=600, "login-account";q=5;w=600`,
				"RateLimit":        `"login-account";r=0;t=120`,
			},
		},
	}
	for _, tt := range tests {
		h := http.Header{}
		setHeaders(h, tt.d)
		for k, want := range tt.want {
			if got := h.Get(k); got != want {
				t.Errorf("%s: %s = %q, want %q", tt.name, k, got, want)
			}
		}
	}
}

// decision builds a Decision as the Limiter does: the worst result is the one with the least
// Remaining, on a tie the longer Reset.
func decision(allowed bool, rs ...ratelimit.Result) ratelimit.Decision {
	d := ratelimit.Decision{Allowed: allowed, Results: rs, Worst: rs[0]}
	for _, r := range rs[1:] {
		if r.Remaining < d.Worst.Remaining || r.Remaining == d.Worst.Remaining && r.Reset > d.Worst.Reset {
			d.Worst = r
		}
	}
	return d
}

func FuzzSetHeaders(f *testing.F) {
	f.Add(true, 10, 7, int64(41_000_001), int64(60_000_000), 5, 0, int64(1), int64(600_000_000))
	f.Add(false, 10, 0, int64(1), int64(1000), 5, 3, int64(0), int64(1000))
	f.Fuzz(func(t *testing.T, allowed bool, limit1, rem1 int, reset1, window1 int64, limit2, rem2 int, reset2, window2 int64) {
		var rs []ratelimit.Result
		for _, r := range []struct {
			limit, rem    int
			reset, window int64
		}{{limit1, rem1, reset1, window1}, {limit2, rem2, reset2, window2}} {
			if r.limit < 1 || r.rem < 0 || r.rem > r.limit || r.reset < 0 || r.window < 1000 || r.reset > r.window ||
				r.window > int64(365*24*time.Hour/time.Microsecond) {
				t.Skip()
			}
			if !allowed && r.reset == 0 {
				t.Skip()
			}
			rs = append(rs, ratelimit.Result{Policy: policy("p"+strconv.Itoa(len(rs)), r.limit, time.Duration(r.window)*time.Microsecond),
				Capacity: r.limit, Remaining: r.rem, Reset: time.Duration(r.reset) * time.Microsecond})
		}
		if !allowed && rs[0].Remaining > 0 && rs[1].Remaining > 0 {
			t.Skip() // the script refuses only when some key is full
		}
		d := decision(allowed, rs...)
		h := http.Header{}
		setHeaders(h, d)
		for k, vs := range h {
			for _, v := range vs {
				if strings.ContainsAny(v, "\r\n") {
					t.Fatalf("%s: %q contains a line break", k, v)
				}
			}
		}
		reset, err := strconv.ParseInt(h.Get("RateLimit-Reset"), 10, 64)
		if err != nil {
			t.Fatalf("RateLimit-Reset %q: %v", h.Get("RateLimit-Reset"), err)
		}
		if time.Duration(reset)*time.Second < d.Worst.Reset || time.Duration(reset-1)*time.Second >= d.Worst.Reset {
			t.Fatalf("RateLimit-Reset %d is not %v rounded up", reset, d.Worst.Reset)
		}
		if got, want := h.Get("RateLimit"), `"`+d.Worst.Policy.Name+`";r=`+h.Get("RateLimit-Remaining")+";t="+h.Get("RateLimit-Reset"); got != want {
			t.Fatalf("RateLimit = %q, want %q", got, want)
		}
		if got := strings.Count(h.Get("RateLimit-Policy"), ";q="); got != len(rs) {
			t.Fatalf("RateLimit-Policy %q lists %d policies, want %d", h.Get("RateLimit-Policy"), got, len(rs))
		}
	})
}

// TestPlainErrorBodiesAreWhatEncodingJSONWrites: the error bodies written without reflection
// (errorBody.appendPlain) are byte for byte what c.JSON writes, and the others are left to it:
// every code with its message, with and without Retry-After, and messages that need escaping.
func TestPlainErrorBodiesAreWhatEncodingJSONWrites(t *testing.T) {
	var bodies []errorBody
	for code := range codes {
		e := &Error{Code: code}
		bodies = append(bodies, errorBody{Error: code, Message: e.message()}, errorBody{Error: code, Message: e.message(), RetryAfterSeconds: 600})
	}
	cents := int64(5)
	bodies = append(bodies, errorBody{Error: CodeInvalidRequest, Message: "a <b> & \"c\" \\ é\n"},
		errorBody{Error: CodeInvalidRequest, Message: "m", Fields: map[string]string{"a": "b"}},
		errorBody{Error: CodeInvalidRequest, Message: "m", RemainingCents: &cents})
	plains := 0
	for _, b := range bodies {
		var want bytes.Buffer
		if err := json.NewEncoder(&want).Encode(b); err != nil {
			t.Fatal(err)
		}
		got, ok := b.appendPlain()
		if !ok {
			continue
		}
		plains++
		if string(got) != want.String() {
			t.Errorf("%+v: wrote %q, encoding/json %q", b, got, want.String())
		}
	}
	if plains < len(codes) {
		t.Errorf("only %d of %d bodies written plain: the common refusals should be", plains, len(bodies))
	}
}
