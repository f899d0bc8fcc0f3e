package main

import (
	"net/http"
	"testing"
)

// TestDeclaredLimit: the demo reads a policy's capacity from RateLimit-Policy as the API writes
// it: q, or the burst of a token bucket or GCRA, vendor-prefixed since wave 3.
func TestDeclaredLimit(t *testing.T) {
	for _, tt := range []struct {
		header, policy string
		want           int
		ok             bool
	}{
		{`"pix";q=10;w=60`, "pix", 10, true},
		{`"pix";q=10;w=20;pixlimit-burst=4`, "pix", 4, true},
		{`"pix";q=10;w=20;burst=4`, "pix", 4, true},
		{`"login-ip";q=10;w=600, "login-account";q=5;w=600`, "login-account", 5, true},
		{`"pix";q=10;w=60`, "statement", 0, false},
	} {
		h := http.Header{"Ratelimit-Policy": {tt.header}}
		if got, ok := declaredLimit(h, tt.policy); got != tt.want || ok != tt.ok {
			t.Errorf("declaredLimit(%q, %q) = %d, %v; want %d, %v", tt.header, tt.policy, got, ok, tt.want, tt.ok)
		}
	}
}
