package httpapi_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/pixlimit/pixlimit/internal/auth"
	"github.com/pixlimit/pixlimit/internal/enforce"
	"github.com/pixlimit/pixlimit/internal/httpapi"
	"github.com/pixlimit/pixlimit/internal/pix"
	"github.com/pixlimit/pixlimit/internal/ratelimit"
	"github.com/pixlimit/pixlimit/internal/ratelimit/denycache"
	"github.com/pixlimit/pixlimit/internal/ratelimit/sequence"
	"github.com/pixlimit/pixlimit/internal/testing/apitest"
	"github.com/pixlimit/pixlimit/internal/testing/redistest"
)

// server is one replica over srv with the demo accounts, the given limits and /readyz probes,
// built from the public pieces as cmd/api builds it.
type server struct {
	h       http.Handler
	ledger  *pix.MemoryLedger
	tokens  *auth.Tokens
	devices *auth.Devices
	// passwords checks at apitest.PasswordCost, the demo accounts' hashes' cost.
	passwords *auth.Passwords
	limiter   *ratelimit.Limiter
	stack     ratelimit.Decider // what the routes decide through: the deny cache, or the limiter
	cache     *denycache.Cache  // nil: none (newServerWith's noDenyCache)
	logs      *apitest.Logs     // what the server logged
}

// lax limits let a test send 1000 requests a minute of every kind.
func lax() enforce.RouteLimits {
	p := func(name string) enforce.RouteLimit {
		return enforce.RouteLimit{Policy: ratelimit.Policy{Name: name, Limit: 1000, Window: time.Minute}}
	}
	return enforce.RouteLimits{PIX: p("pix"), Statement: p("statement"), LoginIP: p("login-ip"), LoginAccount: p("login-account"),
		LoginDevice: p("login-device"), LoginNet: p("login-net"), Settings: p("account-settings"), LookupMissCost: 20,
		PIXLookup:   enforce.RouteLimit{Policy: ratelimit.Policy{Name: "pix-lookup", Limit: 2, Window: time.Minute, Algorithm: ratelimit.TokenBucket, Burst: 100}},
		PIXLookupPJ: enforce.RouteLimit{Policy: ratelimit.Policy{Name: "pix-lookup", Limit: 2, Window: time.Minute, Algorithm: ratelimit.TokenBucket, Burst: 1000}},
		LookupParticipant: enforce.RouteLimit{Policy: ratelimit.Policy{Name: "pix-lookup-participant", Limit: 500, Window: time.Minute,
			Algorithm: ratelimit.TokenBucket, Burst: 4000}},
		LookupParticipantMissCost: 3, LookupCategory: "D"}
}

func newServer(t testing.TB, srv *redistest.Server, limits enforce.RouteLimits, probes ...httpapi.Probe) server {
	t.Helper()
	return newServerWith(t, srv, limits, ratelimit.Options{}, false, probes...)
}

// newServerWith is newServer with the limiter's options (KeySecret and Timeout are set here).
func newServerWith(t testing.TB, srv *redistest.Server, limits enforce.RouteLimits, opts ratelimit.Options, noDenyCache bool, probes ...httpapi.Probe) server {
	t.Helper()
	lax := func(name string) enforce.RouteLimit {
		return enforce.RouteLimit{Policy: ratelimit.Policy{Name: name, Limit: 1000, Window: time.Minute}}
	}
	for _, p := range []*enforce.RouteLimit{&limits.PIX, &limits.Statement, &limits.LoginIP, &limits.LoginAccount} {
		if p.Policy.Name == "" {
			*p = lax(map[*enforce.RouteLimit]string{&limits.PIX: "pix", &limits.Statement: "statement",
				&limits.LoginIP: "login-ip", &limits.LoginAccount: "login-account"}[p])
		}
	}
	ledger, err := pix.NewMemoryLedger(apitest.DemoAccounts(t))
	if err != nil {
		t.Fatal(err)
	}
	secret := []byte(rand.Text() + rand.Text())
	tokens, err := auth.NewTokens(secret, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	devices, err := auth.NewDevices(secret, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	passwords, err := auth.NewPasswords(apitest.PasswordCost)
	if err != nil {
		t.Fatal(err)
	}
	rdb := srv.Client(func(o *redis.Options) { ratelimit.ClientOptions(o, time.Second) })
	opts.KeySecret, opts.Timeout, opts.Sequences = auth.RateLimitKey(secret), time.Second, sequence.New(rdb)
	limiter, err := ratelimit.New(rdb, opts)
	if err != nil {
		t.Fatal(err)
	}
	var cache *denycache.Cache // as a replica has one, unless the test asks for none
	if !noDenyCache {
		if cache, err = denycache.New(limiter, rdb, opts.Prefix, denycache.Options{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cache.Close() })
	}
	var stack ratelimit.Decider = limiter
	if cache != nil {
		stack = cache
	}
	logs := &apitest.Logs{}
	h, err := httpapi.NewServer(httpapi.Deps{Logger: slog.New(slog.NewTextHandler(logs, nil)),
		Limiter: limiter, Stack: stack, DenyCache: cache, Limits: limits, Ledger: ledger, Tokens: tokens, Devices: devices, Passwords: passwords, Probes: probes})
	if err != nil {
		t.Fatal(err)
	}
	return server{h: h, ledger: ledger, tokens: tokens, devices: devices, passwords: passwords, limiter: limiter, stack: stack, cache: cache, logs: logs}
}

// FuzzRequestBodies throws arbitrary bodies at the login and PIX routes: nothing a client sends
// may produce a 5xx, and only a 201 may move money.
func FuzzRequestBodies(f *testing.F) {
	for _, s := range []string{`{"key":"bruno@example.com","amount_cents":1}`, `{"document":"52998224725","password":"x"}`,
		`{"amount_cents":-1}`, `[`, `{"key":"+5511987654321","amount_cents":9223372036854775807,"description":"\u0000"}`} {
		f.Add(s)
	}
	s := newServer(f, redistest.Start(f), lax())
	token, _ := s.tokens.Issue(auth.Subject{Account: "acct-diego", Payer: "payer-diego", Person: "PF"})
	balance := func() int64 {
		st, _ := s.ledger.Statement(context.Background(), "acct-diego", 1)
		return st.BalanceCents
	}
	f.Fuzz(func(t *testing.T, body string) {
		for _, path := range []string{"/v1/pix", "/v1/login"} {
			before := balance()
			req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer "+token)
			rec := httptest.NewRecorder()
			s.h.ServeHTTP(rec, req)
			if rec.Code >= 500 {
				t.Fatalf("%s %q: %d %s", path, body, rec.Code, rec.Body)
			}
			if rec.Code != http.StatusCreated && balance() != before {
				t.Fatalf("%s %q: %d and the balance moved", path, body, rec.Code)
			}
		}
	})
}

// TestHealthChecksAreNotLoggedAtInfo: a container engine and a proxy ask every few seconds; at
// info level only real requests are logged.
func TestHealthChecksAreNotLoggedAtInfo(t *testing.T) {
	t.Parallel()
	s := newServer(t, redistest.Start(t), lax())
	var logs apitest.Logs
	h, err := httpapi.NewServer(httpapi.Deps{Logger: slog.New(slog.NewTextHandler(&logs, nil)), Limiter: s.limiter,
		Limits: lax(), Ledger: s.ledger, Tokens: s.tokens, Devices: s.devices, Passwords: s.passwords})
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/healthz", "/readyz", "/v1/statement"} {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, path, nil))
	}
	out := logs.String()
	if strings.Contains(out, "route=/healthz") || strings.Contains(out, "route=/readyz") || !strings.Contains(out, "route=/v1/statement") {
		t.Errorf("info log:\n%s\nwant the statement request only", out)
	}
}

// panicky is a ledger whose statement panics, as a bug would.
type panicky struct{ pix.Ledger }

func (panicky) Statement(context.Context, string, int) (pix.Statement, error) { panic("a bug") }

// TestPanicsAreAnsweredLoggedAndCounted: a panic in a handler is a JSON 500 that the request log,
// the metrics and an error-level log line with its stack all see, through slog; nothing is
// written anywhere else (Echo's Recover printed its stack on stdout, outside them).
func TestPanicsAreAnsweredLoggedAndCounted(t *testing.T) {
	t.Parallel()
	s := newServer(t, redistest.Start(t), lax())
	var logs apitest.Logs
	reg := prometheus.NewRegistry()
	metrics, err := httpapi.NewMetrics(reg, httpapi.LimiterGauges{RedisUp: func() bool { return s.limiter.Stats().RedisUp }})
	if err != nil {
		t.Fatal(err)
	}
	h, err := httpapi.NewServer(httpapi.Deps{Logger: slog.New(slog.NewJSONHandler(&logs, nil)), Limiter: s.limiter, Metrics: metrics,
		Limits: lax(), Ledger: panicky{s.ledger}, Tokens: s.tokens, Devices: s.devices, Passwords: s.passwords})
	if err != nil {
		t.Fatal(err)
	}
	token, _ := s.tokens.Issue(auth.Subject{Account: "acct-ana", Payer: "payer-ana", Person: "PF"})
	req := httptest.NewRequest(http.MethodGet, "/v1/statement", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusInternalServerError || !strings.Contains(rec.Body.String(), `"error":"internal_error"`) {
		t.Errorf("a panicking handler: %d %s, want a JSON 500 internal_error", rec.Code, rec.Body)
	}
	if strings.Contains(rec.Body.String(), "a bug") {
		t.Errorf("the body %s shows the panic", rec.Body)
	}
	out := logs.String()
	for _, want := range []string{`"level":"ERROR"`, "panic: a bug", "goroutine ", `"msg":"request"`, `"status":500`} {
		if !strings.Contains(out, want) {
			t.Errorf("the log lacks %q:\n%s", want, out)
		}
	}
	if got := (requests(t, reg, "/v1/statement", "GET", "500")); got != 1 {
		t.Errorf("pixlimit_http_requests_total{route=/v1/statement,method=GET,status=500} = %v, want 1", got)
	}
}

// requests is the pixlimit_http_requests_total series of route, method and status.
func requests(t *testing.T, reg *prometheus.Registry, route, method, status string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0.0
	for _, f := range families {
		if f.GetName() != "pixlimit_http_requests_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["route"] == route && labels["method"] == method && labels["status"] == status {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}

// TestMadeUpMethodsMintNoSeries: 3,000 random methods, some of 8 KB, on a route and off any,
// add at most one series per route and status: the method label is a standard method or
// "other", the route a registered template or "unmatched".
func TestMadeUpMethodsMintNoSeries(t *testing.T) {
	t.Parallel()
	s := newServer(t, redistest.Start(t), lax())
	reg := prometheus.NewRegistry()
	metrics, err := httpapi.NewMetrics(reg, httpapi.LimiterGauges{RedisUp: func() bool { return s.limiter.Stats().RedisUp }})
	if err != nil {
		t.Fatal(err)
	}
	h, err := httpapi.NewServer(httpapi.Deps{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Limiter: s.limiter, Metrics: metrics,
		Limits: lax(), Ledger: s.ledger, Tokens: s.tokens, Devices: s.devices, Passwords: s.passwords})
	if err != nil {
		t.Fatal(err)
	}
	series := func() int {
		families, _ := reg.Gather()
		n := 0
		for _, f := range families {
			if strings.HasPrefix(f.GetName(), "pixlimit_http_") {
				n += len(f.GetMetric())
			}
		}
		return n
	}
	before := series()
	for i := range 3000 {
		method := strings.ToUpper(strings.TrimRight(rand.Text(), "="))
		if i%100 == 0 {
			method = strings.Repeat("X", 8<<10) + method
		}
		path := []string{"/v1/login", "/v1/statement", "/nowhere/" + method[:4]}[i%3]
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(method, path, nil))
	}
	// Three routes (two matched, one unmatched), each one status, in two families.
	if added := series() - before; added > 6 {
		t.Errorf("3000 made-up methods added %d series, want at most 6 (one per route and status, in 2 families)", added)
	}
	if got := (requests(t, reg, "unmatched", "other", "404")); got != 1000 {
		t.Errorf("unmatched other 404 = %v, want 1000", got)
	}
}

// BenchmarkRefusal measures what a refused login costs this process, in CPU time per request
// (getrusage: user + system, the replica alone, whatever Redis does, its garbage collection
// included), next to the floor: an Echo handler that only writes the same 429 body. "cached" is
// refused by the deny cache, "redis" asks Redis for every refusal (deny cache off). Sequential
// requests through the handler, no network.
//
// The floor and each of ours are alternated in rounds of 4,000 requests (floor, ours, ours,
// floor, …), so the machine's drift lands on both sides: each reports its CPU per request and
// its ratio to the floor per round, as a median with the lowest and highest.
//
//	go test -run '^$' -bench Refusal -benchtime 20x ./internal/httpapi   (20 rounds)
func BenchmarkRefusal(b *testing.B) {
	srv := redistest.Start(b)
	body := `{"document":"x","password":"y"}` // malformed: counted by the IP key alone, no bcrypt
	login := func(h http.Handler) {
		req := httptest.NewRequest(http.MethodPost, "/v1/login", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.RemoteAddr = "198.51.100.7:1234"
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusTooManyRequests && rec.Code != http.StatusBadRequest {
			b.Fatalf("login: %d %s", rec.Code, rec.Body)
		}
	}
	floor := echo.New()
	floor.POST("/v1/login", func(c echo.Context) error {
		c.Response().Header().Set("Retry-After", "600")
		return c.JSON(http.StatusTooManyRequests, map[string]any{"error": "rate_limit_exceeded",
			"message": "too many requests; retry after the time given", "retry_after_seconds": 600})
	})
	cpu := func() time.Duration {
		var u syscall.Rusage
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &u)
		return time.Duration(u.Utime.Nano() + u.Stime.Nano())
	}
	const round = 4000
	perRequest := func(h http.Handler) float64 {
		start := cpu()
		for range round {
			login(h)
		}
		return float64(cpu()-start) / round
	}
	for _, noCache := range []bool{false, true} {
		b.Run(map[bool]string{false: "cached", true: "redis"}[noCache], func(b *testing.B) {
			limits := lax()
			limits.LoginIP.Policy.Limit = 10
			ours := newServerWith(b, srv, limits, ratelimit.Options{}, noCache).h
			for range 11 { // the IP key's 10, then the first refusal, which teaches the cache
				login(ours)
			}
			perRequest(floor) // both warm
			perRequest(ours)
			var floors, costs, ratios []float64
			b.ResetTimer()
			for i := range b.N {
				var f, o float64
				if i%2 == 0 {
					f, o = perRequest(floor), perRequest(ours)
				} else {
					o, f = perRequest(ours), perRequest(floor)
				}
				floors, costs, ratios = append(floors, f), append(costs, o), append(ratios, o/f)
			}
			b.StopTimer()
			for _, xs := range [][]float64{floors, costs, ratios} {
				slices.Sort(xs)
			}
			b.ReportMetric(costs[len(costs)/2], "cpu-ns/op")
			b.ReportMetric(floors[len(floors)/2], "floor-cpu-ns/op")
			b.ReportMetric(ratios[len(ratios)/2], "median-ratio")
			b.ReportMetric(ratios[0], "lowest-ratio")
			b.ReportMetric(ratios[len(ratios)-1], "highest-ratio")
		})
	}
}

// TestRefusalsAreLoggedAsSummaries: a flood of refused logins is not a flood of log lines: one
// summary line per route and interval, saying how many were held back, and no line per request;
// nor is a flood of any other client error no limit counted, or of OPTIONS (at debug level). A
// 4xx a limit counted keeps its line.
func TestRefusalsAreLoggedAsSummaries(t *testing.T) {
	t.Parallel()
	limits := lax()
	limits.LoginIP.Policy.Limit = 2
	s := newServer(t, redistest.Start(t), limits)
	var logs apitest.Logs
	h, err := httpapi.NewServer(httpapi.Deps{Logger: slog.New(slog.NewTextHandler(&logs, nil)), Limiter: s.limiter,
		Limits: limits, Ledger: s.ledger, Tokens: s.tokens, Devices: s.devices, Passwords: s.passwords})
	if err != nil {
		t.Fatal(err)
	}
	refused := 0
	for range 52 {
		req := httptest.NewRequest(http.MethodPost, "/v1/login", strings.NewReader(`{"document":"x","password":"y"}`))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code == http.StatusTooManyRequests {
			refused++
		}
	}
	out := logs.String()
	if refused != 50 || strings.Count(out, `msg="requests refused"`) != 1 || strings.Count(out, "msg=request method=POST route=/v1/login status=400") != 2 {
		t.Errorf("%d refused; log:\n%s\nwant 50 refusals in one summary line, none logged one by one", refused, out)
	}
	// A token guesser's 401s and a scanner's 404s and 405s: a summary line each, not a line each.
	for _, r := range []struct{ method, path string }{
		{http.MethodGet, "/v1/statement"}, {http.MethodGet, "/v1/nowhere"}, {http.MethodPost, "/healthz"},
	} {
		for range 20 {
			req := httptest.NewRequest(r.method, r.path, nil)
			req.Header.Set("Authorization", "Bearer guess")
			h.ServeHTTP(httptest.NewRecorder(), req)
		}
	}
	out = logs.String()
	if strings.Count(out, `msg="requests refused"`) != 4 || strings.Count(out, "msg=request ") != 2 { // the 2 logins counted by their IP key
		t.Errorf("log:\n%s\nwant a summary line each for the 429s, the 401s, the 404s and the 405s, none one by one", out)
	}
	// What a signed-in client can send without limit: a malformed request, which its route answers
	// before its limit decides (400, 413, 415), and an OPTIONS, answered by Echo from the routes.
	token, err := s.tokens.Issue(auth.Subject{Account: "acct-diego", Payer: s.tokens.PayerID("93541134780"), Person: "PF", Device: "phone"})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct{ method, path, contentType, body string }{
		{http.MethodGet, "/v1/statement?limit=abc", "", ""},
		{http.MethodPost, "/v1/pix", "application/json", `{"key":"bruno@example.com","amount_cents":1}`}, // no Idempotency-Key
		{http.MethodPost, "/v1/pix", "application/json", strings.Repeat(" ", 20<<10)},
		{http.MethodPost, "/v1/pix", "text/plain", "{}"},
		{http.MethodOptions, "/v1/pix", "", ""},
	} {
		for range 20 {
			req := httptest.NewRequest(r.method, r.path, strings.NewReader(r.body))
			req.Header.Set("Authorization", "Bearer "+token)
			if r.contentType != "" {
				req.Header.Set("Content-Type", r.contentType)
			}
			h.ServeHTTP(httptest.NewRecorder(), req)
		}
	}
	out = logs.String()
	for _, status := range []string{"400", "413", "415"} {
		if !strings.Contains(out, `msg="requests refused" route=/v1/pix status=`+status) {
			t.Errorf("log:\n%s\nwant a summary line for the PIX's %ss", out, status)
		}
	}
	if strings.Count(out, `msg="requests refused"`) != 8 || strings.Count(out, "msg=request ") != 2 {
		t.Errorf("log:\n%s\nwant a summary line for the statement's 400s and one for each of the PIX's 400s, 413s and 415s, none one by one, and the OPTIONS at debug level", out)
	}
	// An answer a limit counted keeps its line, a 4xx's too: a PIX to the payer's own key.
	req := httptest.NewRequest(http.MethodGet, "/v1/statement", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	h.ServeHTTP(httptest.NewRecorder(), req)
	req = httptest.NewRequest(http.MethodPost, "/v1/pix", strings.NewReader(`{"key":"diego@example.com","amount_cents":1}`))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "own-key")
	h.ServeHTTP(httptest.NewRecorder(), req)
	if out = logs.String(); strings.Count(out, "msg=request method=GET route=/v1/statement status=200") != 1 ||
		strings.Count(out, "msg=request method=POST route=/v1/pix status=422") != 1 {
		t.Errorf("log:\n%s\nwant the statement's 200 and the PIX's 422 logged", out)
	}
}

// TestATooLargeLoginCountsAgainstItsIP: every login counts against its client's IP key, one
// whose declared body is over the cap too: 413, with the IP key's headers, and the key one
// lower; sent chunked, the same. Another route still refuses such a body before its handler.
func TestATooLargeLoginCountsAgainstItsIP(t *testing.T) {
	t.Parallel()
	limits := lax()
	limits.LoginIP.Policy.Limit = 10
	s := newServer(t, redistest.Start(t), limits)
	body := `{"document":"` + strings.Repeat("1", 17<<10) + `","password":"y"}`
	send := func(chunked bool) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/v1/login", strings.NewReader(body))
		if chunked {
			req.ContentLength = -1
		}
		req.Header.Set("Content-Type", "application/json")
		req.RemoteAddr = "198.51.100.9:1234"
		rec := httptest.NewRecorder()
		s.h.ServeHTTP(rec, req)
		return rec
	}
	for i, chunked := range []bool{false, true, false} {
		rec := send(chunked)
		if got, want := rec.Code, http.StatusRequestEntityTooLarge; got != want {
			t.Fatalf("login %d (chunked %v): %d, want %d", i+1, chunked, got, want)
		}
		if got, want := rec.Header().Get("RateLimit-Remaining"), strconv.Itoa(10-i-1); got != want {
			t.Errorf("login %d (chunked %v): RateLimit-Remaining %q, want %q: counted against its IP", i+1, chunked, got, want)
		}
	}
	req := httptest.NewRequest(http.MethodPost, "/v1/pix", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	s.h.ServeHTTP(rec, req)
	if got, want := rec.Code, http.StatusRequestEntityTooLarge; got != want {
		t.Errorf("a PIX over the cap: %d, want %d before its token is read", got, want)
	}
}

// TestTheProbesAnswerHEAD: /healthz and /readyz answer HEAD as GET, without a body (a load
// balancer may check with it); the API's other routes do not (405).
func TestTheProbesAnswerHEAD(t *testing.T) {
	t.Parallel()
	hs := httptest.NewServer(newServer(t, redistest.Start(t), lax()).h)
	t.Cleanup(hs.Close)
	for path, want := range map[string]int{"/healthz": 200, "/readyz": 200, "/v1/statement": 405} {
		resp, err := http.Head(hs.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want || len(body) != 0 {
			t.Errorf("HEAD %s: %d with %d bytes, want %d and no body", path, resp.StatusCode, len(body), want)
		}
	}
}

// TestNoAnswerIsStored: a login's tokens and a statement's balance must stay out of every cache
// between the client and the API, and no answer may be read as another type than it says: every
// answer, errors included, carries Cache-Control: no-store and nosniff; a 429, which no cache
// stores, neither (a refusal stays as light as it can be).
func TestNoAnswerIsStored(t *testing.T) {
	t.Parallel()
	limits := lax()
	limits.Statement.Policy.Limit = 1
	s := newServer(t, redistest.Start(t), limits)
	token, _ := s.tokens.Issue(auth.Subject{Account: "acct-diego", Payer: "payer-diego", Person: "PF"})
	send := func(method, path, body string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+token)
		rec := httptest.NewRecorder()
		s.h.ServeHTTP(rec, req)
		return rec
	}
	for _, tc := range []struct {
		method, path, body string
		status             int
	}{
		{http.MethodPost, "/v1/login", `{"document":"93541134780","password":"demo-diego-123"}`, http.StatusOK},
		{http.MethodGet, "/v1/statement", "", http.StatusOK},
		{http.MethodGet, "/v1/statement", "", http.StatusTooManyRequests},
		{http.MethodPost, "/v1/pix", `{`, http.StatusBadRequest},
		{http.MethodGet, "/v1/nowhere", "", http.StatusNotFound},
	} {
		rec := send(tc.method, tc.path, tc.body)
		want := [2]string{"no-store", "nosniff"}
		if tc.status == http.StatusTooManyRequests {
			want = [2]string{}
		}
		if got := [2]string{rec.Header().Get("Cache-Control"), rec.Header().Get("X-Content-Type-Options")}; rec.Code != tc.status || got != want {
			t.Errorf("%s %s: %d, Cache-Control and X-Content-Type-Options %q; want %d, %q", tc.method, tc.path, rec.Code, got, tc.status, want)
		}
	}
}

// TestTwoDeviceTokensAreNone: a login's Device-Token moves its count from the document's key to
// its device's, as its cookie does; two Device-Token headers, or two cookies, are ambiguous (a
// proxy may read one, the API another) and move nothing: with the document's key full, a login with its device's token is decided by
// the device's key, and one that adds a second header by the document's, refused.
func TestTwoDeviceTokensAreNone(t *testing.T) {
	t.Parallel()
	limits := lax()
	limits.LoginAccount.Policy.Limit = 1
	limits.LoginDevice = enforce.RouteLimit{Policy: ratelimit.Policy{Name: "login-device", Limit: 5, Window: time.Minute}}
	s := newServer(t, redistest.Start(t), limits)
	diego := apitest.Demo[3]
	document, _, err := pix.ParseDocument(diego.Document)
	if err != nil {
		t.Fatal(err)
	}
	phone, err := s.devices.Issue(document, "phone", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	login := func(cookies bool, tokens ...string) int {
		req := httptest.NewRequest(http.MethodPost, "/v1/login", strings.NewReader(`{"document":"`+diego.Document+`","password":"guess"}`))
		req.Header.Set("Content-Type", "application/json")
		for _, v := range tokens {
			if cookies {
				req.AddCookie(&http.Cookie{Name: "__Host-pixlimit-device", Value: v})
			} else {
				req.Header.Add("Device-Token", v)
			}
		}
		rec := httptest.NewRecorder()
		s.h.ServeHTTP(rec, req)
		return rec.Code
	}
	if got := login(false); got != http.StatusUnauthorized {
		t.Fatalf("a first guess: %d, want 401 (it fills the document's key of 1)", got)
	}
	for _, cookies := range []bool{false, true} {
		if got := login(cookies, phone); got != http.StatusUnauthorized {
			t.Errorf("a guess with the device's token (cookie %v): %d, want 401, decided by the device's key", cookies, got)
		}
		if got := login(cookies, phone, "other"); got != http.StatusTooManyRequests {
			t.Errorf("a guess with two device tokens (cookies %v): %d, want 429, decided by the full document key", cookies, got)
		}
	}
}

// TestABotnetsOwnDeviceTokenBuysItNoTurn: a botnet that logged into its own account once and
// presents that device token with every login of other documents waits in anyone's lane for a
// password comparison (auth.Passwords): Diego, on his phone, sent while its flood waits, is
// compared after a few of its logins at most (the turns alternate), not behind the whole flood.
// Counted in answers, not time: beside four CPU burners and the race detector a comparison takes
// ten times as long.
func TestABotnetsOwnDeviceTokenBuysItNoTurn(t *testing.T) {
	t.Parallel()
	const cost = 8 // enough for a flood to hold every core; cheap enough that a turn or two fit in the second a check waits
	s := newServer(t, redistest.Start(t), lax())
	accounts, err := pix.DemoAccounts(cost)
	if err != nil {
		t.Fatal(err)
	}
	ledger, err := pix.NewMemoryLedger(accounts)
	if err != nil {
		t.Fatal(err)
	}
	passwords, err := auth.NewPasswords(cost)
	if err != nil {
		t.Fatal(err)
	}
	h, err := httpapi.NewServer(httpapi.Deps{Logger: slog.New(slog.DiscardHandler), Limiter: s.limiter, Limits: lax(),
		Ledger: ledger, Tokens: s.tokens, Devices: s.devices, Passwords: passwords})
	if err != nil {
		t.Fatal(err)
	}
	token := func(document string) string {
		doc, err := pix.ParseCPF(document)
		if err != nil {
			t.Fatal(err)
		}
		tok, err := s.devices.Issue(doc, "", time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	bruno, diego := apitest.Demo[1], apitest.Demo[3]
	bot, phone := token(bruno.Document), token(diego.Document) // the botnet's own account: Bruno's
	login := func(document, password, device string, ip int) int {
		req := httptest.NewRequest(http.MethodPost, "/v1/login", strings.NewReader(`{"document":"`+document+`","password":"`+password+`"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Device-Token", device)
		req.RemoteAddr = "198.51.100." + strconv.Itoa(ip%250) + ":1234"
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	const flood = 100         // quietly, all compared within the second a check waits: behind it, Diego would wait for all
	var compared atomic.Int64 // the flood's logins compared (401), not those that waited out their second (503)
	first, done := make(chan struct{}), make(chan struct{}, flood)
	var once sync.Once
	for i := range flood {
		go func() {
			if login(apitest.CPF(i), "guess", bot, i) == http.StatusUnauthorized {
				compared.Add(1)
				once.Do(func() { close(first) })
			}
			done <- struct{}{}
		}()
	}
	<-first // the flood's first comparisons are done: the rest wait for theirs
	before := compared.Load()
	got := login(diego.Document, diego.Password, phone, 251)
	behind := compared.Load() - before
	// A few: those the turns alternate with, and those that end while his login does its other
	// work (its body, its limiter call), up to 12 seen. Behind the flood it was 76 to 95.
	if got != http.StatusOK || behind > 25 {
		t.Errorf("Diego on his phone, sent while a flood presenting the botnet's own device token waits: %d, after %d of its comparisons; want 200, after a few at most (25), not the flood's", got, behind)
	}
	for range flood {
		<-done
	}
}

// TestASlowBodyIsRefusedInTime: a body trickled in after its headers is read for bodyWithin at
// most, then refused 400, on a real connection: the write timeout counts from the headers, so a
// PIX whose body took seconds could otherwise be made with its answer past it. A login so refused
// still counts against its IP key (its RateLimit headers say so).
func TestASlowBodyIsRefusedInTime(t *testing.T) {
	t.Parallel()
	s := newServer(t, redistest.Start(t), lax())
	hs := httptest.NewServer(s.h)
	t.Cleanup(hs.Close)
	token, err := s.tokens.Issue(auth.Subject{Account: "acct-ana", Payer: s.tokens.PayerID(apitest.Demo[0].Document), Person: "PF", Device: "phone"})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct{ path, headers, body string }{
		{"/v1/login", "", `{"document":"52998224725","password":"demo-ana-123"}`},
		{"/v1/pix", "Authorization: Bearer " + token + "\r\nIdempotency-Key: slow\r\n", `{"key":"bruno@example.com","amount_cents":100}`},
	} {
		conn, err := net.Dial("tcp", strings.TrimPrefix(hs.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: api\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s",
			r.path, len(r.body), r.headers, r.body[:5]) // the rest never comes
		start := time.Now()
		_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
		res, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("%s: %v after %v", r.path, err, time.Since(start))
		}
		res.Body.Close()
		if res.StatusCode != http.StatusBadRequest || time.Since(start) > 10*time.Second ||
			r.path == "/v1/login" && !strings.Contains(res.Header.Get("RateLimit-Policy"), `"login-ip"`) {
			t.Errorf("%s with a body that stops: %d after %v, RateLimit-Policy %q; want 400 at once, a login counted by its IP key",
				r.path, res.StatusCode, time.Since(start), res.Header.Get("RateLimit-Policy"))
		}
	}
	if st, err := s.ledger.Statement(context.Background(), "acct-ana", 1); err != nil || st.BalanceCents != 1_000_000 {
		t.Errorf("Ana's balance %d (%v), want 1000000: the PIX whose body never came moved nothing", st.BalanceCents, err)
	}
}
