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
	"github.com/pixlimit/pixlimit/internal/testing/apitest"
	"github.com/pixlimit/pixlimit/internal/testing/redistest"
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
