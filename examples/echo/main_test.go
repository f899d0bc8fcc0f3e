package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/pixlimit/pixlimit/internal/testing/redistest"
)

// TestHelloIsLimited: six requests from one IP get five 200s, then a 429 with Retry-After, whatever
// X-Forwarded-For they carry; another IP still gets its own five.
func TestHelloIsLimited(t *testing.T) {
	t.Parallel()
	e, err := newServer(redistest.Start(t).Client(nil), []byte("a test secret of 32 bytes, long."))
	if err != nil {
		t.Fatal(err)
	}
	spoofed := 0
	get := func(ip string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodGet, "/hello", nil)
		req.RemoteAddr = ip + ":40000"
		spoofed++ // a new address each time in a header anyone can write: not the client's
		req.Header.Set("X-Forwarded-For", fmt.Sprintf("192.0.2.%d", spoofed))
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, req)
		return rec
	}
	for i := range 5 {
		if rec := get("203.0.113.7"); rec.Code != http.StatusOK || rec.Header().Get("RateLimit-Remaining") != []string{"4", "3", "2", "1", "0"}[i] {
			t.Fatalf("request %d: %d, RateLimit-Remaining %q", i+1, rec.Code, rec.Header().Get("RateLimit-Remaining"))
		}
	}
	if rec := get("203.0.113.7"); rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") == "" {
		t.Errorf("the sixth request: %d, Retry-After %q; want 429 with Retry-After", rec.Code, rec.Header().Get("Retry-After"))
	}
	if rec := get("198.51.100.9"); rec.Code != http.StatusOK {
		t.Errorf("another IP: %d, want 200", rec.Code)
	}
}
