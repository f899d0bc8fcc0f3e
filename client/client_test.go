package client

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestAPIXCarriesItsKeyBack: a PIX's fresh Idempotency-Key comes back on its Response, with an
// answer or without one (the transport's error), so a retry can send the same key.
func TestAPIXCarriesItsKeyBack(t *testing.T) {
	var sent []string
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sent = append(sent, r.Header.Get("Idempotency-Key"))
		w.Header().Set("Retry-After", "2")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"error":"transfer_outcome_unknown","message":"m"}`))
	}))
	defer api.Close()
	c := &Client{BaseURL: api.URL + "/"} // a trailing slash is dropped
	r, err := c.PIX(context.Background(), "tok", Transfer{Key: "bruno@example.com", AmountCents: 1})
	if err != nil || r.Code != "transfer_outcome_unknown" || r.RetryAfter() != 2*time.Second || r.IdempotencyKey == "" || sent[0] != r.IdempotencyKey {
		t.Fatalf("PIX: %v %v, code %q, retry after %v, key %q (sent %q)", r, err, r.Code, r.RetryAfter(), r.IdempotencyKey, sent)
	}
	again, _ := c.PIX(context.Background(), "tok", Transfer{Key: "bruno@example.com", AmountCents: 1}, "Idempotency-Key", r.IdempotencyKey)
	if sent[1] != r.IdempotencyKey || again.IdempotencyKey != r.IdempotencyKey {
		t.Errorf("the retry sent %q, its Response says %q; want the first's %q", sent[1], again.IdempotencyKey, r.IdempotencyKey)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if r, err := c.PIX(ctx, "tok", Transfer{Key: "bruno@example.com", AmountCents: 1}); err == nil || r.IdempotencyKey == "" {
		t.Errorf("a PIX that got no answer: %v, key %q; want an error and its key", err, r.IdempotencyKey)
	}
}

// TestWhatTheClientRefusesToSend: headers not in pairs, and a key that would name another path.
func TestWhatTheClientRefusesToSend(t *testing.T) {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("%s %s sent", r.Method, r.URL.Path)
	}))
	defer api.Close()
	c := &Client{BaseURL: api.URL}
	if _, err := c.PIX(context.Background(), "tok", Transfer{}, "Idempotency-Key"); err == nil {
		t.Error("an odd header list: no error")
	}
	for _, key := range []string{"", ".", ".."} {
		if _, err := c.LookupKey(context.Background(), "tok", key); err == nil {
			t.Errorf("look up %q: no error", key)
		}
	}
}

// TestAnAnswerIsReadWhole: an answer past 1 MiB is an error, not a body silently cut; a proxy's
// HTML error has no Code; a login's tokens never show in a Response's String.
func TestAnAnswerIsReadWhole(t *testing.T) {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/big":
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(strings.Repeat("x", maxBody+1)))
		case "/html":
			w.WriteHeader(http.StatusBadGateway)
			_, _ = w.Write([]byte("<html>502 Bad Gateway</html>"))
		default:
			_, _ = w.Write([]byte(`{"access_token": "secret-a", "device_token":"secret-d", "account_id":"acc"}`))
		}
	}))
	defer api.Close()
	c := &Client{BaseURL: api.URL}
	if _, err := c.Do(context.Background(), http.MethodGet, "/big", nil); err == nil {
		t.Error("an answer past 1 MiB: no error")
	}
	if r, err := c.Do(context.Background(), http.MethodGet, "/html", nil); err != nil || r.Status != http.StatusBadGateway || r.Code != "" {
		t.Errorf("a proxy's HTML 502: %v %v, code %q; want 502, no code", r, err, r.Code)
	}
	r, err := c.Do(context.Background(), http.MethodGet, "/login", nil)
	if s := r.String(); err != nil || strings.Contains(s, "secret") || !strings.Contains(s, `"account_id":"acc"`) {
		t.Errorf("a login's String: %q %v; want its tokens masked, the rest shown", s, err)
	}
}
