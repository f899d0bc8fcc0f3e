package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pixlimit/pixlimit/internal/auth"
	"github.com/pixlimit/pixlimit/internal/testing/apitest"
	"github.com/pixlimit/pixlimit/internal/testing/redistest"
)

// TestMalformedRequests sends what a careless or hostile client might: every answer is a 4xx
// with a JSON error body, and no balance moves.
func TestMalformedRequests(t *testing.T) {
	t.Parallel()
	a := startAPI(t, redistest.Start(t), map[string]string{
		"PIX_LIMIT": "1000", "STATEMENT_LIMIT": "1000", "LOGIN_IP_LIMIT": "1000", "LOGIN_ACCOUNT_LIMIT": "1000",
	})
	tokens := make([]string, len(demo))
	for i, d := range demo {
		tokens[i] = a.Token(d.Document, d.Password)
	}
	balances := func() (b []int64) {
		for _, tok := range tokens {
			b = append(b, a.Balance(tok))
		}
		return b
	}
	before := balances()
	ana := "Bearer " + tokens[0]
	big := `{"key":"bruno@example.com","amount_cents":1,"description":"` + strings.Repeat("x", 20_000) + `"}`
	none := "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.eyJzdWIiOiJhY2N0LWFuYSIsImV4cCI6OTk5OTk5OTk5OX0."
	expired := "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJhY2N0LWFuYSIsImV4cCI6MX0.c2lnbmF0dXJl"

	tests := []struct {
		name, method, path, body string
		headers                  []string
		want                     int
	}{
		// login
		{"login: empty body", "POST", "/v1/login", "", nil, 400},
		{"login: not JSON", "POST", "/v1/login", "document=1", nil, 400},
		{"login: truncated JSON", "POST", "/v1/login", `{"document":"529`, nil, 400},
		{"login: array", "POST", "/v1/login", `[]`, nil, 400},
		{"login: null", "POST", "/v1/login", `null`, nil, 400},
		{"login: unknown field", "POST", "/v1/login", `{"document":"52998224725","password":"x","admin":true}`, nil, 400},
		{"login: number document", "POST", "/v1/login", `{"document":52998224725,"password":"x"}`, nil, 400},
		{"login: bad check digit", "POST", "/v1/login", `{"document":"52998224726","password":"x"}`, nil, 400},
		{"login: all-equal CPF", "POST", "/v1/login", `{"document":"111.111.111-11","password":"x"}`, nil, 400},
		{"login: letters", "POST", "/v1/login", `{"document":"abc","password":"x"}`, nil, 400},
		{"login: no password", "POST", "/v1/login", `{"document":"52998224725"}`, nil, 400},
		{"login: 73-byte password", "POST", "/v1/login", `{"document":"52998224725","password":"` + strings.Repeat("p", 73) + `"}`, nil, 400},
		{"login: two objects", "POST", "/v1/login", `{"document":"52998224725","password":"x"}{}`, nil, 400},
		{"login: text/plain", "POST", "/v1/login", `{"document":"52998224725","password":"x"}`, []string{"Content-Type", "text/plain"}, 415},
		{"login: huge body", "POST", "/v1/login", `{"document":"` + strings.Repeat("1", 20_000) + `"}`, nil, 413},
		{"login: GET", "GET", "/v1/login", "", nil, 405},
		// authentication
		{"pix: no token", "POST", "/v1/pix", `{"key":"bruno@example.com","amount_cents":1}`, []string{"Authorization", ""}, 401},
		{"pix: garbage token", "POST", "/v1/pix", `{"key":"bruno@example.com","amount_cents":1}`, []string{"Authorization", "Bearer abc.def.ghi"}, 401},
		{"pix: alg none", "POST", "/v1/pix", `{"key":"bruno@example.com","amount_cents":1}`, []string{"Authorization", "Bearer " + none}, 401},
		{"pix: expired", "POST", "/v1/pix", `{"key":"bruno@example.com","amount_cents":1}`, []string{"Authorization", "Bearer " + expired}, 401},
		{"pix: Basic", "POST", "/v1/pix", `{"key":"bruno@example.com","amount_cents":1}`, []string{"Authorization", "Basic YTpi"}, 401},
		{"statement: no token", "GET", "/v1/statement", "", []string{"Authorization", ""}, 401},
		// PIX bodies
		{"pix: empty body", "POST", "/v1/pix", "", nil, 400},
		{"pix: zero", "POST", "/v1/pix", `{"key":"bruno@example.com","amount_cents":0}`, nil, 400},
		{"pix: negative", "POST", "/v1/pix", `{"key":"bruno@example.com","amount_cents":-100}`, nil, 400},
		{"pix: fraction", "POST", "/v1/pix", `{"key":"bruno@example.com","amount_cents":15.5}`, nil, 400},
		{"pix: exponent", "POST", "/v1/pix", `{"key":"bruno@example.com","amount_cents":1e3}`, nil, 400},
		{"pix: overflow", "POST", "/v1/pix", `{"key":"bruno@example.com","amount_cents":9223372036854775808}`, nil, 400},
		{"pix: huge", "POST", "/v1/pix", `{"key":"bruno@example.com","amount_cents":1e400}`, nil, 400},
		{"pix: string amount", "POST", "/v1/pix", `{"key":"bruno@example.com","amount_cents":"100"}`, nil, 400},
		{"pix: missing amount", "POST", "/v1/pix", `{"key":"bruno@example.com"}`, nil, 400},
		{"pix: missing key", "POST", "/v1/pix", `{"amount_cents":100}`, nil, 400},
		{"pix: bad e-mail", "POST", "/v1/pix", `{"key":"bruno@","amount_cents":100}`, nil, 400},
		{"pix: bad phone", "POST", "/v1/pix", `{"key":"+55 11 98765-4321","amount_cents":100}`, nil, 400},
		{"pix: bad CPF", "POST", "/v1/pix", `{"key":"39053344706","amount_cents":100}`, nil, 400},
		{"pix: bad UUID", "POST", "/v1/pix", `{"key":"zzzzzzzz-e89b-42d3-a456-426614174000","amount_cents":100}`, nil, 400},
		{"pix: unknown field", "POST", "/v1/pix", `{"key":"bruno@example.com","amount_cents":100,"from":"acct-bruno"}`, nil, 400},
		{"pix: long description", "POST", "/v1/pix", `{"key":"bruno@example.com","amount_cents":100,"description":"` + strings.Repeat("d", 141) + `"}`, nil, 400},
		{"pix: control character", "POST", "/v1/pix", `{"key":"bruno@example.com","amount_cents":100,"description":"a\u0000b"}`, nil, 400},
		{"pix: bad Idempotency-Key", "POST", "/v1/pix", `{"key":"bruno@example.com","amount_cents":100}`, []string{"Idempotency-Key", "has spaces"}, 400},
		{"pix: no Idempotency-Key", "POST", "/v1/pix", `{"key":"bruno@example.com","amount_cents":100}`, []string{"Idempotency-Key", ""}, 400},
		{"pix: above the largest amount", "POST", "/v1/pix", `{"key":"bruno@example.com","amount_cents":100000000001}`, nil, 400},
		{"pix: the largest int64", "POST", "/v1/pix", `{"key":"bruno@example.com","amount_cents":9223372036854775807}`, nil, 400},
		{"pix: long Idempotency-Key", "POST", "/v1/pix", `{"key":"bruno@example.com","amount_cents":100}`, []string{"Idempotency-Key", strings.Repeat("k", 65)}, 400},
		{"pix: huge body", "POST", "/v1/pix", big, nil, 413},
		{"pix: duplicate member", "POST", "/v1/pix", `{"key":"bruno@example.com","amount_cents":1,"amount_cents":400000}`, nil, 400},
		{"pix: member differing in case", "POST", "/v1/pix", `{"key":"bruno@example.com","amount_cents":1,"AMOUNT_CENTS":400000}`, nil, 400},
		{"pix: only a differently cased member", "POST", "/v1/pix", `{"key":"bruno@example.com","Amount_Cents":400000}`, nil, 400},
		{"login: duplicate member", "POST", "/v1/login", `{"document":"52998224725","password":"x","password":"y"}`, nil, 400},
		{"login: member differing in case", "POST", "/v1/login", `{"Document":"52998224725","password":"x"}`, nil, 400},
		{"pix: invalid UTF-8", "POST", "/v1/pix", "{\"key\":\"bruno@example.com\",\"amount_cents\":1,\"description\":\"\xff\"}", nil, 400},
		{"pix: form content type", "POST", "/v1/pix", `{"key":"bruno@example.com","amount_cents":100}`, []string{"Content-Type", "application/x-www-form-urlencoded"}, 415},
		// statement
		{"statement: limit 0", "GET", "/v1/statement?limit=0", "", nil, 400},
		{"statement: limit 101", "GET", "/v1/statement?limit=101", "", nil, 400},
		{"statement: limit abc", "GET", "/v1/statement?limit=abc", "", nil, 400},
		{"statement: limit -1", "GET", "/v1/statement?limit=-1", "", nil, 400},
		{"statement: a bad escape in the query", "GET", "/v1/statement?limit=1%zz", "", nil, 400}, // Echo's QueryParams drops the pair
		{"statement: a semicolon in the query", "GET", "/v1/statement?limit=1;", "", nil, 400},
		{"statement: POST", "POST", "/v1/statement", "", nil, 405},
		// elsewhere
		{"unknown route", "GET", "/v1/admin", "", nil, 404},
	}
	if len(tests) < 40 {
		t.Fatalf("%d cases, want at least 40", len(tests))
	}
	for _, tt := range tests {
		headers := append([]string{"Authorization", ana, "Idempotency-Key", apitest.NewIdempotencyKey()}, tt.headers...)
		var body any
		if tt.method == http.MethodPost {
			body = tt.body // with the JSON content type, even when empty
		}
		r := a.Do(tt.method, tt.path, body, headers...)
		if r.Status != tt.want {
			t.Errorf("%s: %v, want %d", tt.name, r, tt.want)
			continue
		}
		if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
			t.Errorf("%s: Content-Type %q, want JSON", tt.name, ct)
		}
		if code, _ := r.JSON(t)["error"].(string); code == "" {
			t.Errorf("%s: body %s has no error code", tt.name, r.Body)
		}
	}
	after := balances()
	for i := range before {
		if before[i] != after[i] {
			t.Errorf("%s's balance moved from %d to %d", demo[i].Name, before[i], after[i])
		}
	}
	logs := a.logs.String()
	for _, secret := range []string{"52998224725", "529.982.247-25", "demo-ana-123", tokens[0]} {
		if strings.Contains(logs, secret) {
			t.Errorf("the log contains %q", secret)
		}
	}
}

// TestBodiesAndHeadersThatCouldMeanTwoThings: a chunked body over the limit is 413 like a
// declared one, and a second Idempotency-Key header is 400 rather than silently ignored.
func TestBodiesAndHeadersThatCouldMeanTwoThings(t *testing.T) {
	t.Parallel()
	a := startAPI(t, redistest.Start(t), nil)
	token := a.Token(demo[1].Document, demo[1].Password)
	send := func(body io.Reader, header http.Header) apitest.Response {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, a.Base+"/v1/pix", body)
		if err != nil {
			t.Fatal(err)
		}
		req.Header = header
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+token)
		return a.Send(req)
	}
	// A reader of unknown length makes the client send the body chunked, with no Content-Length.
	chunked := io.MultiReader(strings.NewReader(`{"key":"ana@example.com","amount_cents":1,"description":"`),
		strings.NewReader(strings.Repeat("x", 20_000)), strings.NewReader(`"}`))
	if r := send(chunked, http.Header{}); r.Status != http.StatusRequestEntityTooLarge || r.JSON(t)["error"] != "request_too_large" {
		t.Errorf("chunked body of 20 KB: %v, want 413 request_too_large", r)
	}
	two := http.Header{"Idempotency-Key": {"first", "second"}}
	if r := send(strings.NewReader(`{"key":"ana@example.com","amount_cents":1}`), two); r.Status != http.StatusBadRequest {
		t.Errorf("two Idempotency-Key headers: %v, want 400", r)
	}
	if got := a.Balance(token); got != 500_000 {
		t.Errorf("Bruno's balance %d, want 500000: nothing may move", got)
	}
}

// TestShutdownDrainsInFlightRequests stops the server, as SIGTERM does, while a login (a bcrypt
// comparison at a real deployment's cost, tens of milliseconds) is in flight: the login still gets its answer, after the
// stop began, and Run returns nil. When to stop is a guess (too early and the server has not
// accepted the connection yet; too late and the login is already answered), so the test tries a
// few delays and needs one that proves the drain.
func TestShutdownDrainsInFlightRequests(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	for _, delay := range []time.Duration{10, 20, 30, 45, 60} {
		delay *= time.Millisecond
		ctx, cancel := context.WithCancel(context.Background())
		a, done := launchAt(t, ctx, srv, nil, auth.DefaultPasswordCost)
		conn, err := net.Dial("tcp", strings.TrimPrefix(a.Base, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		_ = conn.SetDeadline(time.Now().Add(30 * time.Second)) // a server that never answers fails the test, not the package
		body := `{"document":"529.982.247-25","password":"demo-ana-123"}`
		fmt.Fprintf(conn, "POST /v1/login HTTP/1.1\r\nHost: api\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		time.Sleep(delay)
		stopped := time.Now()
		cancel()
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		answered := time.Now()
		conn.Close()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("Run after shutdown: %v, want nil", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("Run did not return within 30s of its shutdown")
		}
		if err != nil {
			t.Logf("stopping after %v: %v (the server had not accepted it yet)", delay, err)
			continue
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("in-flight login during shutdown: %d, want 200", resp.StatusCode)
		}
		// The server logs a request when it has answered it: after "shutting down", it was drained.
		logs := a.logs.String()
		if i := strings.Index(logs, "shutting down"); i >= 0 && i < strings.Index(logs, "route=/v1/login") {
			t.Logf("stopped %v after sending; the login was answered %v after the stop began", delay, answered.Sub(stopped).Round(time.Millisecond))
			return
		}
		t.Logf("stopping after %v: the login was answered before the stop", delay)
	}
	t.Fatal("no delay caught a login in flight: the drain was never exercised")
}
