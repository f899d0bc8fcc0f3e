package main

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pixlimit/pixlimit/internal/testing/redistest"
)

func TestPIXLimitIsPerAccountAndRefusalsMoveNoMoney(t *testing.T) {
	t.Parallel()
	a := startAPI(t, redistest.Start(t), nil) // every request from 127.0.0.1: one office, one IP
	ana := a.Token(demo[0].Document, demo[0].Password)
	before := a.Balance(ana)
	for i := range 11 {
		r := a.PIX(ana, "bruno@example.com", 100)
		if want := map[bool]int{true: 429, false: 201}[i == 10]; r.Status != want {
			t.Fatalf("PIX %d: %v, want %d", i+1, r, want)
		}
		if i == 10 {
			if r.Header.Get("Retry-After") == "" || r.JSON(t)["error"] != "rate_limit_exceeded" {
				t.Errorf("11th PIX: %v %v, want Retry-After and rate_limit_exceeded", r, r.Header)
			}
		} else if got := r.Header.Get("RateLimit-Remaining"); got != fmt.Sprint(9-i) {
			t.Errorf("PIX %d: RateLimit-Remaining %s, want %d", i+1, got, 9-i)
		}
	}
	if got, want := a.Balance(ana), before-10*100; got != want {
		t.Errorf("Ana's balance = %d, want %d: only the 10 admitted transfers move money", got, want)
	}
	// Bruno and Carla, behind the same IP, have their whole quota.
	for _, who := range demo[1:3] {
		tok := a.Token(who.Document, who.Password)
		for i := range 10 {
			if r := a.PIX(tok, "diego@example.com", 1); r.Status != http.StatusCreated {
				t.Fatalf("%s's PIX %d behind Ana's IP: %v, want 201", who.Name, i+1, r)
			}
		}
	}
}

func TestStatementLimit(t *testing.T) {
	t.Parallel()
	a := startAPI(t, redistest.Start(t), nil)
	tok := a.Token(demo[1].Document, demo[1].Password)
	for i := range 31 {
		r := a.Statement(tok)
		if want := map[bool]int{true: 429, false: 200}[i == 30]; r.Status != want {
			t.Fatalf("statement %d: %v, want %d", i+1, r, want)
		}
	}
}

func TestIdempotentPIX(t *testing.T) {
	t.Parallel()
	a := startAPI(t, redistest.Start(t), nil)
	tok := a.Token(demo[0].Document, demo[0].Password)
	before := a.Balance(tok)
	first := a.PIX(tok, "carla@example.com", 700, "Idempotency-Key", "order-1")
	again := a.PIX(tok, "carla@example.com", 700, "Idempotency-Key", "order-1")
	if first.Status != 201 || again.Status != 201 || string(first.Body) != string(again.Body) {
		t.Fatalf("replay: %v then %v, want the same 201", first, again)
	}
	if r := a.PIX(tok, "carla@example.com", 701, "Idempotency-Key", "order-1"); r.Status != http.StatusConflict || r.JSON(t)["error"] != "idempotency_conflict" {
		t.Errorf("same key, other body: %v, want 409 idempotency_conflict", r)
	}
	if got, want := a.Balance(tok), before-700; got != want {
		t.Errorf("balance %d, want %d: a replay moves no money", got, want)
	}
	id := first.JSON(t)["end_to_end_id"].(string)
	if len(id) != 32 || !strings.HasPrefix(id, "E99999999"+time.Now().UTC().Format("20060102")) {
		t.Errorf("end_to_end_id %q: want E + ISPB + yyyyMMddHHmm + 11 alphanumerics", id)
	}
}

// TestAPIXNeedsAnIdempotencyKey: without the header, 400 idempotency_key_required, saying so,
// and nothing moves; the answer a retry relies on exists only for a named transfer.
func TestAPIXNeedsAnIdempotencyKey(t *testing.T) {
	t.Parallel()
	a := startAPI(t, redistest.Start(t), nil)
	tok := a.Token(demo[0].Document, demo[0].Password)
	before := a.Balance(tok)
	for range 2 {
		r := a.PIX(tok, "carla@example.com", 700, "Idempotency-Key", "")
		if body := r.JSON(t); r.Status != http.StatusBadRequest || body["error"] != "idempotency_key_required" ||
			!strings.Contains(body["message"].(string), "Idempotency-Key") {
			t.Errorf("PIX without Idempotency-Key: %v, want 400 idempotency_key_required naming the header", r)
		}
	}
	if got := a.Balance(tok); got != before {
		t.Errorf("balance %d, want %d: nothing moves", got, before)
	}
}

func TestPIXDomainErrors(t *testing.T) {
	t.Parallel()
	a := startAPI(t, redistest.Start(t), nil)
	diego := a.Token(demo[3].Document, demo[3].Password)
	for _, tt := range []struct {
		key   string
		cents int64
		want  int
		code  string
	}{
		{"nobody@example.com", 1, 404, "key_not_found"},
		{"00000000-0000-4000-8000-000000000000", 1, 404, "key_not_found"},
		{"ana@example.com", 100_001, 422, "insufficient_funds"},
		{"diego@example.com", 1, 422, "same_account"},
		{"93541134780", 1, 422, "same_account"},
		{"+5511987654321", 5, 201, ""},
	} {
		r := a.PIX(diego, tt.key, tt.cents)
		if r.Status != tt.want || tt.code != "" && r.JSON(t)["error"] != tt.code {
			t.Errorf("PIX to %s of %d: %v, want %d %s", tt.key, tt.cents, r, tt.want, tt.code)
		}
	}
}

// TestConcurrentTransfers keeps the books over HTTP: 8 goroutines × 100 random transfers among
// the demo accounts never make a balance negative, money appear or vanish, or a 5xx. (The
// ledger's own test, in internal/pix, checks every entry of every statement adds up.)
func TestConcurrentTransfers(t *testing.T) {
	t.Parallel()
	a := startAPI(t, redistest.Start(t), map[string]string{"PIX_LIMIT": "100000", "PIX_CONCURRENCY": "0", "STATEMENT_LIMIT": "100000"})
	tokens := make([]string, len(demo))
	for i, d := range demo {
		tokens[i] = a.Token(d.Document, d.Password)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	statuses := map[int]int{}
	for g := range 8 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			for range 100 {
				from, to := rng.IntN(4), rng.IntN(4)
				r := a.PIX(tokens[from], demo[to].Key, int64(1+rng.IntN(60_000)))
				mu.Lock()
				statuses[r.Status]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for s := range statuses {
		if s != 201 && s != 422 {
			t.Errorf("status %d answered %d times, want only 201 and 422", s, statuses[s])
		}
	}
	if statuses[201] < 300 {
		t.Errorf("only %d transfers admitted: the test moved too little money to prove anything", statuses[201])
	}
	var total int64
	seen := map[string]int{}
	for i, tok := range tokens {
		r := a.Do(http.MethodGet, "/v1/statement?limit=100", nil, "Authorization", "Bearer "+tok)
		body := r.JSON(t)
		balance := int64(body["balance_cents"].(float64))
		if balance < 0 {
			t.Errorf("%s: negative balance %d", demo[i].Name, balance)
		}
		total += balance
		for _, e := range body["entries"].([]any) {
			seen[e.(map[string]any)["end_to_end_id"].(string)]++
		}
	}
	if want := demoOpening(); total != want {
		t.Errorf("sum of balances %d, want %d: money was created or destroyed", total, want)
	}
	for id, n := range seen {
		if n > 2 {
			t.Errorf("end_to_end_id %s appears %d times, want once out and once in", id, n)
		}
	}
	t.Logf("statuses: %v", statuses)
}

func TestAlgorithmPerRoute(t *testing.T) {
	t.Parallel()
	a := startAPI(t, redistest.Start(t), map[string]string{
		"PIX_ALGORITHM": "token_bucket", "PIX_BURST": "3", "STATEMENT_ALGORITHM": "fixed_window", "LOGIN_ALGORITHM": "gcra",
	})
	tok := a.Token(demo[0].Document, demo[0].Password)
	for i := range 4 {
		r := a.PIX(tok, "bruno@example.com", 1)
		if want := map[bool]int{true: 429, false: 201}[i == 3]; r.Status != want {
			t.Fatalf("PIX %d with a bucket of 3: %v, want %d", i+1, r, want)
		}
		if got, want := r.Header.Get("RateLimit-Policy"), `"pix";q=10;w=60;pixlimit-burst=3`; got != want {
			t.Errorf("RateLimit-Policy = %q, want %q", got, want)
		}
		if got := r.Header.Get("RateLimit-Limit"); got != "3" {
			t.Errorf("RateLimit-Limit = %q, want the burst, 3", got)
		}
		if i == 3 {
			// 10 per minute: one token every 6s.
			if got := r.Header.Get("Retry-After"); got != "6" {
				t.Errorf("Retry-After = %q, want 6 (one token every 6s)", got)
			}
		}
	}
	r := a.Statement(tok)
	if r.Status != 200 || r.Header.Get("RateLimit-Remaining") != "29" {
		t.Errorf("fixed-window statement: %v %v", r, r.Header)
	}
}
