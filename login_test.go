package pixlimit_test

import (
	"bytes"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pixlimit/pixlimit/internal/redistest"
)

func TestLoginIssuesATokenTheAPIAccepts(t *testing.T) {
	t.Parallel()
	a := startAPI(t, redistest.Start(t), nil)
	r := a.login("529.982.247-25", "demo-ana-123")
	if r.status != http.StatusOK {
		t.Fatalf("login: %v", r)
	}
	body := r.json(t)
	if body["token_type"] != "Bearer" || body["expires_in"] != 900.0 || body["account_id"] == "" || body["access_token"] == "" {
		t.Errorf("login body = %v, want token_type Bearer, expires_in 900, an account_id and a token", body)
	}
	if got, want := r.header.Get("RateLimit-Policy"), `"login-ip";q=10;w=600`; got != want {
		t.Errorf("RateLimit-Policy = %q, want %q: an admitted login reports its IP key only", got, want)
	}
	if got := a.login("52998224725", "demo-ana-123").json(t)["account_id"]; got != body["account_id"] {
		t.Errorf("the document without punctuation logs into %v, want %v", got, body["account_id"])
	}
	st := a.statement(body["access_token"].(string))
	if st.status != http.StatusOK || st.json(t)["account_id"] != body["account_id"] {
		t.Fatalf("statement with the token: %v", st)
	}
}

func TestWrongPasswordAndUnknownDocumentLookTheSame(t *testing.T) {
	t.Parallel()
	a := startAPI(t, redistest.Start(t), map[string]string{"TRUSTED_PROXIES": "127.0.0.1/32"})
	unknown := cpf(42) // valid CPF, no account
	wrong := a.login("529.982.247-25", "not-the-password", "X-Forwarded-For", "198.51.100.1")
	missing := a.login(unknown, "not-the-password", "X-Forwarded-For", "198.51.100.2")

	if wrong.status != http.StatusUnauthorized || missing.status != http.StatusUnauthorized {
		t.Fatalf("wrong password: %v; unknown document: %v; want 401 both", wrong, missing)
	}
	if !bytes.Equal(wrong.body, missing.body) {
		t.Errorf("bodies differ:\n wrong password:   %s\n unknown document: %s", wrong.body, missing.body)
	}
	if got := wrong.json(t)["error"]; got != "invalid_credentials" {
		t.Errorf("error = %v, want invalid_credentials", got)
	}
	stable := func(h http.Header) http.Header {
		h = h.Clone()
		for k := range h {
			if strings.HasPrefix(k, "Ratelimit") || k == "Date" {
				delete(h, k)
			}
		}
		return h
	}
	if w, m := stable(wrong.header), stable(missing.header); !maps.EqualFunc(w, m, slices.Equal) {
		t.Errorf("headers differ (RateLimit and Date aside):\n wrong password:   %v\n unknown document: %v", w, m)
	}
	// Both paths run bcrypt: an unknown document is compared against a dummy hash.
	for name, r := range map[string]response{"wrong password": wrong, "unknown document": missing} {
		if r.took < 20*time.Millisecond {
			t.Errorf("%s answered in %v: too fast for a bcrypt comparison", name, r.took)
		}
	}
}

func TestLoginRefusalsByEitherKeyLookTheSame(t *testing.T) {
	t.Parallel()
	a := startAPI(t, redistest.Start(t), map[string]string{"TRUSTED_PROXIES": "127.0.0.1/32"})

	// A botnet: 6 IPs, one guess each at Carla's document. The document key allows 5.
	var byDocument response
	for i := range 6 {
		byDocument = a.login("111.444.777-35", "guess", "X-Forwarded-For", fmt.Sprintf("203.0.113.%d", i+1))
		if want := map[bool]int{true: 429, false: 401}[i == 5]; byDocument.status != want {
			t.Fatalf("guess %d from its own IP: %v, want %d", i+1, byDocument, want)
		}
	}
	// One IP, 11 different documents. The IP key allows 10.
	var byIP response
	for i := range 11 {
		byIP = a.login(cpf(i), "guess", "X-Forwarded-For", "198.51.100.77")
		if want := map[bool]int{true: 429, false: 401}[i == 10]; byIP.status != want {
			t.Fatalf("document %d from one IP: %v, want %d", i+1, byIP, want)
		}
	}

	for name, r := range map[string]response{"document key": byDocument, "IP key": byIP} {
		body := r.json(t)
		if body["error"] != "rate_limit_exceeded" || r.header.Get("Retry-After") == "" ||
			r.header.Get("Retry-After") != r.header.Get("RateLimit-Reset") {
			t.Errorf("refused by the %s: %v %v", name, r, r.header)
		}
		if got, want := r.header.Get("RateLimit-Policy"), `"login-ip";q=10;w=600, "login-account";q=5;w=600`; got != want {
			t.Errorf("refused by the %s: RateLimit-Policy = %q, want %q", name, got, want)
		}
	}
	strip := func(r response) map[string]any {
		m := r.json(t)
		delete(m, "retry_after_seconds") // seconds left differ with timing, not with the key
		return m
	}
	if d, i := strip(byDocument), strip(byIP); !maps.Equal(d, i) {
		t.Errorf("the two refusals differ:\n document key: %v\n IP key:       %v", d, i)
	}
	if !slices.Equal(slices.Sorted(maps.Keys(byDocument.header)), slices.Sorted(maps.Keys(byIP.header))) {
		t.Errorf("the two refusals carry different headers: %v vs %v", byDocument.header, byIP.header)
	}
}

// TestALoginDoesNotRevealSomeoneElsesActivity: three guesses at Ana's document from other IPs,
// then a stranger logs in with Ana's CPF from a fresh IP, and with a CPF no account has. Neither
// answer says how many attempts the document has had: both report the stranger's own IP key.
func TestALoginDoesNotRevealSomeoneElsesActivity(t *testing.T) {
	t.Parallel()
	a := startAPI(t, redistest.Start(t), map[string]string{"TRUSTED_PROXIES": "127.0.0.1/32"})
	for i := range 3 {
		a.login(demo[0].document, "guess", "X-Forwarded-For", fmt.Sprintf("192.0.2.%d", i+1))
		a.login(cpf(7), "guess", "X-Forwarded-For", fmt.Sprintf("192.0.2.%d", i+1))
	}
	for name, r := range map[string]response{
		"Ana's CPF":    a.login(demo[0].document, "guess", "X-Forwarded-For", "198.51.100.50"),
		"unknown CPF":  a.login(cpf(7), "guess", "X-Forwarded-For", "198.51.100.51"),
		"Ana herself":  a.login(demo[0].document, demo[0].password, "X-Forwarded-For", "198.51.100.52"),
		"invalid body": a.login("not a CPF", "x", "X-Forwarded-For", "198.51.100.53"),
	} {
		if got, want := r.header.Get("RateLimit"), `"login-ip";r=9;t=600`; got != want {
			t.Errorf("%s from a fresh IP: RateLimit %q, want %q (its own IP key only)", name, got, want)
		}
		if got, want := r.header.Get("RateLimit-Policy"), `"login-ip";q=10;w=600`; got != want {
			t.Errorf("%s: RateLimit-Policy %q, want %q", name, got, want)
		}
	}
}

func TestRefusalByTheDocumentKeyConsumesNoIPQuota(t *testing.T) {
	t.Parallel()
	a := startAPI(t, redistest.Start(t), map[string]string{"TRUSTED_PROXIES": "127.0.0.1/32"})
	for i := range 5 { // fill Diego's document key from five other IPs
		a.login("935.411.347-80", "guess", "X-Forwarded-For", fmt.Sprintf("192.0.2.%d", i+1))
	}
	const ip = "198.51.100.9"
	for i := range 20 { // insisting on the full document from one IP
		if r := a.login("935.411.347-80", "guess", "X-Forwarded-For", ip); r.status != http.StatusTooManyRequests {
			t.Fatalf("attempt %d on the full document: %v, want 429", i+1, r)
		}
	}
	// The IP still has all 10 of its attempts.
	for i := range 10 {
		r := a.login(cpf(100+i), "guess", "X-Forwarded-For", ip)
		if r.status != http.StatusUnauthorized {
			t.Fatalf("attempt %d of the IP's quota after 20 refusals: %v, want 401", i+1, r)
		}
	}
}

func TestForwardedForIsHonouredOnlyFromTrustedProxies(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	direct := startAPI(t, srv, map[string]string{"LOGIN_IP_LIMIT": "3"})
	behindProxy := startAPI(t, srv, map[string]string{"LOGIN_IP_LIMIT": "3", "TRUSTED_PROXIES": "127.0.0.0/8, ::1/128"})

	// No trusted proxy: a client rotating X-Forwarded-For is still one client.
	for i := range 4 {
		r := direct.do(http.MethodPost, "/v1/login", `{"document":"x","password":"y"}`, "X-Forwarded-For", fmt.Sprintf("203.0.113.%d", i))
		if want := map[bool]int{true: 429, false: 400}[i == 3]; r.status != want {
			t.Fatalf("spoofed X-Forwarded-For, request %d: %v, want %d", i+1, r, want)
		}
	}
	// Behind a trusted proxy each forwarded client has its own quota, keyed by the right-most
	// untrusted hop: what the client wrote to the left of it does not matter.
	for i := range 4 {
		xff := fmt.Sprintf("10.9.9.%d, 203.0.113.50", i)
		if r := behindProxy.do(http.MethodPost, "/v1/login", `{"document":"x","password":"y"}`, "X-Forwarded-For", xff); r.status != map[bool]int{true: 429, false: 400}[i == 3] {
			t.Fatalf("client 203.0.113.50 with forged hops, request %d: %v", i+1, r)
		}
	}
	if r := behindProxy.do(http.MethodPost, "/v1/login", `{"document":"x","password":"y"}`, "X-Forwarded-For", "203.0.113.51"); r.status != http.StatusBadRequest {
		t.Fatalf("another forwarded client: %v, want 400 (not limited)", r)
	}
	// Both IPv6 addresses of one /64 are one client.
	for i := range 4 {
		xff := fmt.Sprintf("2001:db8:aa:bb::%x", i+1)
		if r := behindProxy.do(http.MethodPost, "/v1/login", `{"document":"x","password":"y"}`, "X-Forwarded-For", xff); r.status != map[bool]int{true: 429, false: 400}[i == 3] {
			t.Fatalf("IPv6 %s, request %d of one /64: %v", xff, i+1, r)
		}
	}
}
