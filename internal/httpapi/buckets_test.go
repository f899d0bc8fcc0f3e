package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pixlimit/pixlimit/internal/auth"
	"github.com/pixlimit/pixlimit/internal/httpapi"
	"github.com/pixlimit/pixlimit/internal/pix"
	"github.com/pixlimit/pixlimit/internal/ratelimit/denycache"
	"github.com/pixlimit/pixlimit/internal/testing/apitest"
	"github.com/pixlimit/pixlimit/internal/testing/redistest"
	"github.com/prometheus/client_golang/prometheus"
)

// heldLookUps is a ledger whose key look-ups wait at a gate: look-ups past their buckets' ask,
// not yet charged.
type heldLookUps struct {
	*pix.MemoryLedger
	arrived chan struct{}
	gate    chan struct{}
}

func (l *heldLookUps) LookupKey(ctx context.Context, key string) (pix.Payee, error) {
	l.arrived <- struct{}{}
	<-l.gate
	return l.MemoryLedger.LookupKey(ctx, key)
}

// TestTheBanksRefusalCostsTheCustomerNothing: four misses asked together of a bank's bucket of 3
// tokens all pass its ask (it holds a token); charged after the ledger, the first takes the bank's
// 3 and is answered 404, and the bank's bucket refuses the other three: 503
// lookup_capacity_exhausted without RateLimit headers, and the payer's bucket is given back what
// each paid, so it holds 100 - 20, one miss's price.
func TestTheBanksRefusalCostsTheCustomerNothing(t *testing.T) {
	t.Parallel()
	limits := lax()
	limits.LookupParticipant.Policy.Limit, limits.LookupParticipant.Policy.Burst = 1, 3 // 3 tokens, 1 a minute
	s := newServer(t, redistest.Start(t), limits)
	inner, err := pix.NewMemoryLedger(apitest.DemoAccounts(t))
	if err != nil {
		t.Fatal(err)
	}
	ledger := &heldLookUps{MemoryLedger: inner, arrived: make(chan struct{}, 4), gate: make(chan struct{})}
	h, err := httpapi.NewServer(httpapi.Deps{Logger: slog.New(slog.DiscardHandler), Limiter: s.limiter, Limits: limits,
		Ledger: ledger, Tokens: s.tokens, Devices: s.devices, Passwords: s.passwords})
	if err != nil {
		t.Fatal(err)
	}
	token, err := s.tokens.Issue(auth.Subject{Account: "acct-diego", Payer: s.tokens.PayerID("93541134780"), Person: "PF", Device: "phone"})
	if err != nil {
		t.Fatal(err)
	}
	get := func(path string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodGet, path, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	answers := make([]*httptest.ResponseRecorder, 4)
	var wg sync.WaitGroup
	for i := range answers {
		wg.Go(func() { answers[i] = get(fmt.Sprintf("/v1/pix/keys/ghost%d@example.com", i)) })
	}
	for range answers {
		select {
		case <-ledger.arrived: // past both buckets' ask
		case <-time.After(30 * time.Second):
			t.Fatal("the look-ups did not reach the ledger within 30s")
		}
	}
	close(ledger.gate)
	wg.Wait()
	statuses := map[int]int{}
	for _, rec := range answers {
		statuses[rec.Code]++
		if rec.Code == http.StatusServiceUnavailable && rec.Header().Get("RateLimit-Policy") != "" {
			t.Errorf("a 503 lookup_capacity_exhausted with RateLimit-Policy %q: the bank's bucket is not the customer's to see", rec.Header().Get("RateLimit-Policy"))
		}
	}
	if statuses[http.StatusNotFound] != 1 || statuses[http.StatusServiceUnavailable] != 3 {
		t.Fatalf("four misses against a bank's bucket of 3: %v, want one 404 and three 503", statuses)
	}
	var limitsBody struct {
		Policies []struct {
			Name      string `json:"name"`
			Available int    `json:"available_tokens"`
		} `json:"policies"`
	}
	if err := json.Unmarshal(get("/v1/pix/keys/limits").Body.Bytes(), &limitsBody); err != nil {
		t.Fatal(err)
	}
	got := -1
	for _, p := range limitsBody.Policies {
		if p.Name == limits.PIXLookup.Policy.Name {
			got = p.Available
		}
	}
	if got != 100-20 {
		t.Errorf("the payer's bucket holds %d tokens, want 80: one miss answered, the three the bank refused given back", got)
	}
}

// TestTheBanksRefusalsAreLoggedAsASummary: while the bank's bucket is empty, a customer's
// look-ups are 503 lookup_capacity_exhausted, which spend none of her own tokens, so she can send
// them without end: they are logged as a counted summary, not a line each.
func TestTheBanksRefusalsAreLoggedAsASummary(t *testing.T) {
	t.Parallel()
	limits := lax()
	limits.LookupParticipant.Policy.Limit, limits.LookupParticipant.Policy.Burst = 1, 1
	s := newServer(t, redistest.Start(t), limits)
	logs := &apitest.Logs{}
	h, err := httpapi.NewServer(httpapi.Deps{Logger: slog.New(slog.NewTextHandler(logs, nil)), Limiter: s.limiter, Limits: limits,
		Ledger: s.ledger, Tokens: s.tokens, Devices: s.devices, Passwords: s.passwords})
	if err != nil {
		t.Fatal(err)
	}
	token, err := s.tokens.Issue(auth.Subject{Account: "acct-diego", Payer: s.tokens.PayerID("93541134780"), Person: "PF", Device: "phone"})
	if err != nil {
		t.Fatal(err)
	}
	statuses := map[int]int{}
	for i := range 21 {
		req := httptest.NewRequest(http.MethodGet, fmt.Sprintf("/v1/pix/keys/ghost%d@example.com", i), nil)
		req.Header.Set("Authorization", "Bearer "+token)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		statuses[rec.Code]++
	}
	out := logs.String()
	if statuses[http.StatusNotFound] != 1 || statuses[http.StatusServiceUnavailable] != 20 ||
		strings.Count(out, "status=503") != 1 || !strings.Contains(out, `msg="requests refused" route=/v1/pix/keys/:key status=503`) {
		t.Errorf("%v; log:\n%s\nwant one 404, then 20 × 503 in one summary line", statuses, out)
	}
}

// TestALookUpIsOneDecision: pixlimit_ratelimit_decisions_total counts a look-up once per bucket,
// admitted by its ask, not again by the charge that pays for it (a dashboard's refusal ratio was
// half the true one), and a PIX to a key nobody has likewise; pixlimit_ratelimit_decision_seconds
// observes what Redis decided, not a refusal from the replica's memory of a full key.
func TestALookUpIsOneDecision(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	limits := lax()
	limits.Statement.Policy.Limit = 1
	s := newServer(t, srv, limits)
	cache, err := denycache.New(s.limiter, srv.Client(nil), "", denycache.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cache.Close() })
	reg := prometheus.NewRegistry()
	metrics, err := httpapi.NewMetrics(reg, httpapi.LimiterGauges{RedisUp: func() bool { return true }})
	if err != nil {
		t.Fatal(err)
	}
	h, err := httpapi.NewServer(httpapi.Deps{Logger: slog.New(slog.DiscardHandler), Limiter: s.limiter, Stack: cache, DenyCache: cache,
		Metrics: metrics, Limits: limits, Ledger: s.ledger, Tokens: s.tokens, Devices: s.devices, Passwords: s.passwords})
	if err != nil {
		t.Fatal(err)
	}
	token, err := s.tokens.Issue(auth.Subject{Account: "acct-diego", Payer: s.tokens.PayerID("93541134780"), Person: "PF", Device: "phone"})
	if err != nil {
		t.Fatal(err)
	}
	send := func(method, path, body string) int {
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", apitest.NewIdempotencyKey())
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	metric := func(name, policy, outcome string) float64 {
		families, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range families {
			for _, m := range f.GetMetric() {
				labels := map[string]string{}
				for _, l := range m.GetLabel() {
					labels[l.GetName()] = l.GetValue()
				}
				if f.GetName() == name && labels["policy"] == policy && labels["outcome"] == outcome {
					return m.GetCounter().GetValue() + float64(m.GetHistogram().GetSampleCount())
				}
			}
		}
		return 0
	}
	decisions := func(policy string) float64 { return metric("pixlimit_ratelimit_decisions_total", policy, "allowed") }
	if got := send(http.MethodGet, "/v1/pix/keys/bruno@example.com", ""); got != http.StatusOK {
		t.Fatalf("a look-up: %d", got)
	}
	if got := send(http.MethodPost, "/v1/pix", `{"key":"nobody@example.com","amount_cents":100}`); got != http.StatusNotFound {
		t.Fatalf("a PIX to a key nobody has: %d", got)
	}
	if a, b := decisions("pix-lookup"), decisions("pix-lookup-participant"); a != 2 || b != 2 {
		t.Errorf("a look-up and a PIX's miss counted %v and %v admissions of the payer's and the bank's buckets, want 2 each", a, b)
	}
	for _, want := range []int{http.StatusOK, http.StatusTooManyRequests, http.StatusTooManyRequests} { // the last from memory
		if got := send(http.MethodGet, "/v1/statement", ""); got != want {
			t.Fatalf("a statement: %d, want %d", got, want)
		}
	}
	if cached, timed := metric("pixlimit_ratelimit_decisions_total", "statement", "refused_cached"),
		metric("pixlimit_ratelimit_decision_seconds", "statement", ""); cached != 1 || timed != 2 {
		t.Errorf("%v statements refused from memory, %v decisions timed; want 1, and 2 timed: Redis's alone", cached, timed)
	}
}
