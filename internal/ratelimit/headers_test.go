package ratelimit

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestSetHeaders(t *testing.T) {
	pix := policy("pix", 10, time.Minute)
	ip, doc := policy("login-ip", 10, 10*time.Minute), policy("login-account", 5, 10*time.Minute)
	tests := []struct {
		name string
		d    Decision
		want map[string]string
	}{
		{
			name: "allowed",
			d:    decision(true, Result{Policy: pix, Allowed: true, Limit: 10, Remaining: 7, Reset: 41*time.Second + time.Millisecond}),
			want: map[string]string{
				"RateLimit-Limit": "10", "RateLimit-Remaining": "7", "RateLimit-Reset": "42",
				"RateLimit-Policy": `"pix";q=10;w=60`, "RateLimit": `"pix";r=7;t=42`, "Retry-After": "",
			},
		},
		{
			name: "refused: Retry-After equals RateLimit-Reset",
			d:    decision(false, Result{Policy: pix, Limit: 10, Reset: 2500 * time.Millisecond, RetryAfter: 2500 * time.Millisecond}),
			want: map[string]string{
				"RateLimit-Remaining": "0", "RateLimit-Reset": "3", "Retry-After": "3", "RateLimit": `"pix";r=0;t=3`,
			},
		},
		{
			name: "refused with under a millisecond left: never Retry-After 0",
			d:    decision(false, Result{Policy: pix, Limit: 10, Reset: time.Microsecond, RetryAfter: time.Microsecond}),
			want: map[string]string{"RateLimit-Reset": "1", "Retry-After": "1"},
		},
		{
			name: "login: both policies listed, the worst reported",
			d: decision(false,
				Result{Policy: ip, Allowed: true, Limit: 10, Remaining: 4, Reset: 300 * time.Second},
				Result{Policy: doc, Limit: 5, Reset: 120 * time.Second, RetryAfter: 120 * time.Second}),
			want: map[string]string{
				"RateLimit-Limit": "5", "RateLimit-Remaining": "0", "RateLimit-Reset": "120", "Retry-After": "120",
				"RateLimit-Policy": `"login-ip";q=10;w=600, "login-account";q=5;w=600`,
				"RateLimit":        `"login-account";r=0;t=120`,
			},
		},
	}
	for _, tt := range tests {
		h := http.Header{}
		SetHeaders(h, tt.d)
		for k, want := range tt.want {
			if got := h.Get(k); got != want {
				t.Errorf("%s: %s = %q, want %q", tt.name, k, got, want)
			}
		}
	}
}

// decision builds a Decision the way newDecision does: the worst result embedded.
func decision(allowed bool, rs ...Result) Decision {
	checks := make([]Check, len(rs))
	pairs := make([]int64, 0, 2*len(rs))
	for i, r := range rs {
		checks[i] = Check{Policy: r.Policy}
		pairs = append(pairs, int64(r.Remaining), r.Reset.Microseconds())
	}
	return newDecision(allowed, pairs, checks)
}

func FuzzSetHeaders(f *testing.F) {
	f.Add(true, 10, 7, int64(41_000_001), int64(60_000_000), 5, 0, int64(1), int64(600_000_000))
	f.Add(false, 10, 0, int64(1), int64(1000), 5, 3, int64(0), int64(1000))
	f.Fuzz(func(t *testing.T, allowed bool, limit1, rem1 int, reset1, window1 int64, limit2, rem2 int, reset2, window2 int64) {
		var rs []Result
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
			rs = append(rs, Result{Policy: policy("p"+strconv.Itoa(len(rs)), r.limit, time.Duration(r.window)*time.Microsecond),
				Limit: r.limit, Remaining: r.rem, Reset: time.Duration(r.reset) * time.Microsecond})
		}
		if !allowed && rs[0].Remaining > 0 && rs[1].Remaining > 0 {
			t.Skip() // the script refuses only when some key is full
		}
		d := decision(allowed, rs...)
		h := http.Header{}
		SetHeaders(h, d)
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
		if time.Duration(reset)*time.Second < d.Reset || time.Duration(reset-1)*time.Second >= d.Reset {
			t.Fatalf("RateLimit-Reset %d is not %v rounded up", reset, d.Reset)
		}
		if got, want := h.Get("RateLimit"), `"`+d.Policy.Name+`";r=`+h.Get("RateLimit-Remaining")+";t="+h.Get("RateLimit-Reset"); got != want {
			t.Fatalf("RateLimit = %q, want %q", got, want)
		}
		if got := strings.Count(h.Get("RateLimit-Policy"), ";q="); got != len(rs) {
			t.Fatalf("RateLimit-Policy %q lists %d policies, want %d", h.Get("RateLimit-Policy"), got, len(rs))
		}
		if ra := h.Get("Retry-After"); allowed != (ra == "") || !allowed && ra != strconv.FormatInt(max(1, reset), 10) {
			t.Fatalf("allowed=%v: Retry-After %q, RateLimit-Reset %d", allowed, ra, reset)
		}
	})
}
