package apitest

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// recorder is a testing.TB that keeps what it is told.
type recorder struct {
	testing.TB
	errs []string
}

func (r *recorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}
func (r *recorder) Helper() {}

// TestTheContractLoads: both documents load, validate, and every reference resolves.
func TestTheContractLoads(t *testing.T) {
	if _, err := LoadContract(); err != nil {
		t.Fatal(err)
	}
}

// TestTheCheckCanFail: answers the document does not describe are findings, and ones it does are
// not. A fake server answers each as the table says.
func TestTheCheckCanFail(t *testing.T) {
	for _, tc := range []struct {
		name, method, path, body string
		status                   int
		answer                   string
		want                     string // a finding's text, or "" for none
	}{
		{"healthz as described", "GET", "/healthz", "", 200, `{"status":"ok"}`, ""},
		{"healthz with another body", "GET", "/healthz", "", 200, `{"status":"fine"}`, "does not describe"},
		{"healthz with a member more", "GET", "/healthz", "", 200, `{"status":"ok","extra":1}`, "does not describe"},
		{"an error code nobody defined", "GET", "/v1/statement", "", 400, `{"error":"oops","message":"m"}`, "does not describe"},
		{"a 201 for a login", "POST", "/v1/login", `{"document":"52998224725","password":"x"}`, 201, `{}`, "does not describe"},
		{"a served request the document rejects", "POST", "/v1/login", `{"document":"52998224725"}`, 200,
			`{"access_token":"a","token_type":"Bearer","expires_in":900,"account_id":"x","device_token":"d"}`, "rejects the request"},
		{"a rejected request, rejected", "POST", "/v1/login", `{"document":"52998224725"}`, 400,
			`{"error":"invalid_request","message":"m","fields":{"password":"required"}}`, ""},
		{"no route, answered 200", "GET", "/v1/nothing", "", 200, `{}`, "no route"},
		{"no route, answered 404", "GET", "/v1/nothing", "", 404, `{"error":"not_found","message":"no such route"}`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(tc.status)
				fmt.Fprint(w, tc.answer)
			}))
			defer srv.Close()
			rec := &recorder{TB: t}
			c := &Client{T: rec, Base: srv.URL}
			var body any
			if tc.body != "" {
				body = tc.body
			}
			c.Do(tc.method, tc.path, body)
			got := strings.Join(rec.errs, "\n")
			switch {
			case tc.want == "" && got != "":
				t.Errorf("a finding for an answer the document describes: %s", got)
			case tc.want != "" && !strings.Contains(got, tc.want):
				t.Errorf("findings %q, want one saying %q", got, tc.want)
			}
		})
	}
}

// BenchmarkCheck is one PIX exchange's check: what every whole-program test pays per request.
//
//	go test -run '^$' -bench Check ./internal/testing/apitest
func BenchmarkCheck(b *testing.B) {
	c, err := LoadContract()
	if err != nil {
		b.Fatal(err)
	}
	req := httptest.NewRequest("POST", "http://127.0.0.1:1/v1/pix", strings.NewReader(`{"key":"bruno@example.com","amount_cents":100}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "abc")
	req.Header.Set("Authorization", "Bearer x")
	h := http.Header{"Content-Type": {"application/json"}, "Ratelimit-Limit": {"10"}, "Ratelimit-Remaining": {"9"}, "Ratelimit-Reset": {"60"}, "Ratelimit-Policy": {`"pix";q=10;w=60`}, "Ratelimit": {`"pix";r=9;t=60`}}
	body := []byte(`{"end_to_end_id":"E99999999202612011125OSOLME3AJVH","amount_cents":100,"balance_cents":100,"to":{"key":"bruno@example.com","name":"Bruno"},"created_at":"2026-12-01T11:25:34Z"}`)
	b.ResetTimer()
	for range b.N {
		if err := c.Check(req, []byte(`{"key":"bruno@example.com","amount_cents":100}`), 201, h, body); err != nil {
			b.Fatal(err)
		}
	}
}
