package httpapi_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pixlimit/pixlimit/internal/auth"
	"github.com/pixlimit/pixlimit/internal/httpapi"
	"github.com/pixlimit/pixlimit/internal/pix"
	"github.com/pixlimit/pixlimit/internal/testing/apitest"
	"github.com/pixlimit/pixlimit/internal/testing/redistest"
)

// stuckTransfers is a ledger whose transfers wait until released, each holding its place.
type stuckTransfers struct {
	*pix.MemoryLedger
	in      atomic.Int32
	release chan struct{}
}

func (l *stuckTransfers) Transfer(ctx context.Context, r pix.TransferRequest) (pix.Receipt, error) {
	l.in.Add(1)
	select {
	case <-l.release:
	case <-ctx.Done():
		return pix.Receipt{}, ctx.Err()
	}
	return l.MemoryLedger.Transfer(ctx, r)
}

// TestALoginTakesItsAccountsShareOfTheLedger: a login's look-up takes a place of the same share
// of the ledger as its account's calls: with Ana's two places held by two PIX in progress, a login
// to her document waits its turn and is 503 ledger_busy, having asked the ledger nothing (it took
// a place of its own, and one account held twice its share), and not logged as an error of the
// server, and spent none of its keys' quota (withdrawn); Bruno's login is served.
func TestALoginTakesItsAccountsShareOfTheLedger(t *testing.T) {
	t.Parallel()
	s := newServer(t, redistest.Start(t), lax())
	ledger := &stuckTransfers{MemoryLedger: s.ledger, release: make(chan struct{})}
	share, err := pix.NewShare(2, 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	logs := &apitest.Logs{}
	h, err := httpapi.NewServer(httpapi.Deps{Logger: slog.New(slog.NewTextHandler(logs, nil)), Limiter: s.limiter, Limits: lax(), Ledger: pix.Shared(ledger, share), Share: share,
		Tokens: s.tokens, Devices: s.devices, Passwords: s.passwords})
	if err != nil {
		t.Fatal(err)
	}
	ana, bruno := apitest.Demo[0], apitest.Demo[1]
	document, _, err := pix.ParseDocument(ana.Document)
	if err != nil {
		t.Fatal(err)
	}
	token, err := s.tokens.Issue(auth.Subject{Account: "acct-ana", Payer: s.tokens.PayerID(document), Person: "PF"})
	if err != nil {
		t.Fatal(err)
	}
	serve := func(req *http.Request) *httptest.ResponseRecorder {
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	var pixes sync.WaitGroup
	for range 2 {
		pixes.Go(func() {
			req := httptest.NewRequest(http.MethodPost, "/v1/pix", strings.NewReader(`{"key":"bruno@example.com","amount_cents":1}`))
			req.Header.Set("Authorization", "Bearer "+token)
			req.Header.Set("Idempotency-Key", apitest.NewIdempotencyKey())
			if rec := serve(req); rec.Code != http.StatusCreated {
				t.Errorf("Ana's PIX: %d %s, want 201", rec.Code, rec.Body)
			}
		})
	}
	defer pixes.Wait()
	defer close(ledger.release)
	for deadline := time.Now().Add(10 * time.Second); ledger.in.Load() < 2; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of Ana's 2 PIX reached the ledger", ledger.in.Load())
		}
	}
	login := func(document, password string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/v1/login", strings.NewReader(`{"document":"`+document+`","password":"`+password+`"}`))
		req.RemoteAddr = "198.51.100.9:1234"
		return serve(req)
	}
	if rec := login(ana.Document, ana.Password); rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), `"ledger_busy"`) {
		t.Errorf("Ana's login while her 2 places are held: %d %s, want 503 ledger_busy", rec.Code, rec.Body)
	}
	if strings.Contains(logs.String(), "level=ERROR") {
		t.Errorf("a login shed ledger_busy logged as an error of the server:\n%s", logs)
	}
	// From the same address: the IP key counts Bruno's login alone, Ana's shed one taken back.
	if rec := login(bruno.Document, bruno.Password); rec.Code != http.StatusOK || rec.Header().Get("RateLimit-Remaining") != "999" {
		t.Errorf("Bruno's login meanwhile: %d, RateLimit-Remaining %q; want 200 and 999 (of 1000: Ana's shed login spent none)",
			rec.Code, rec.Header().Get("RateLimit-Remaining"))
	}
}

// TestARetryWhoseClientLeftSpendsNothing: a PIX whose client has left by the time its wait for
// its key's original (in progress on the same replica) ends is decided by nothing: the PIX limit
// counts the original and the next PIX alone.
func TestARetryWhoseClientLeftSpendsNothing(t *testing.T) {
	t.Parallel()
	limits := lax()
	limits.PIX.Policy.Limit = 5
	s := newServer(t, redistest.Start(t), limits)
	ledger := &stuckTransfers{MemoryLedger: s.ledger, release: make(chan struct{})}
	h, err := httpapi.NewServer(httpapi.Deps{Logger: slog.New(slog.DiscardHandler), Limiter: s.limiter, Limits: limits, Ledger: ledger,
		Tokens: s.tokens, Devices: s.devices, Passwords: s.passwords})
	if err != nil {
		t.Fatal(err)
	}
	token, err := s.tokens.Issue(auth.Subject{Account: "acct-ana", Payer: s.tokens.PayerID(apitest.Demo[0].Document), Person: "PF", Device: "phone"})
	if err != nil {
		t.Fatal(err)
	}
	send := func(ctx context.Context, idem string) *httptest.ResponseRecorder {
		req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/v1/pix", strings.NewReader(`{"key":"bruno@example.com","amount_cents":100}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Idempotency-Key", idem)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	original := make(chan *httptest.ResponseRecorder, 1)
	go func() { original <- send(context.Background(), "original") }()
	for deadline := time.Now().Add(30 * time.Second); ledger.in.Load() < 1; time.Sleep(5 * time.Millisecond) { // polling, not timing
		if time.Now().After(deadline) {
			t.Fatal("the original did not reach the ledger within 30s")
		}
	}
	left, leave := context.WithCancel(context.Background())
	leave() // the retry's client has gone: its wait for the original ends at once
	send(left, "original")
	close(ledger.release)
	if r := <-original; r.Code != http.StatusCreated {
		t.Fatalf("the original: %d %s", r.Code, r.Body)
	}
	next := send(context.Background(), "next")
	if next.Code != http.StatusCreated || next.Header().Get("RateLimit-Remaining") != "3" {
		t.Errorf("the next PIX: %d, RateLimit-Remaining %q; want 201 and 3 (of 5: the original and this one)", next.Code, next.Header().Get("RateLimit-Remaining"))
	}
}

// TestAPIXRefusedAtItsMissSpendsNoQuota: Diego's PIX to a key nobody has is admitted (his look-up
// bucket holds a token) and held in the ledger while five misses of his empty that bucket; its
// miss's charge is then refused, 429, and its own limit's admission is taken back: a refusal
// records nothing. The PIX limit's log holds no entry.
func TestAPIXRefusedAtItsMissSpendsNoQuota(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	limits := lax()
	limits.PIX.Policy.Limit = 5
	s := newServer(t, srv, limits)
	ledger := &stuckTransfers{MemoryLedger: s.ledger, release: make(chan struct{})}
	h, err := httpapi.NewServer(httpapi.Deps{Logger: slog.New(slog.DiscardHandler), Limiter: s.limiter, Limits: limits, Ledger: ledger,
		Tokens: s.tokens, Devices: s.devices, Passwords: s.passwords})
	if err != nil {
		t.Fatal(err)
	}
	token, err := s.tokens.Issue(auth.Subject{Account: "acct-diego", Payer: s.tokens.PayerID("93541134780"), Person: "PF", Device: "phone"})
	if err != nil {
		t.Fatal(err)
	}
	send := func(method, path, body string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Idempotency-Key", apitest.NewIdempotencyKey())
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	held := make(chan *httptest.ResponseRecorder, 1)
	go func() { held <- send(http.MethodPost, "/v1/pix", `{"key":"nobody@example.com","amount_cents":100}`) }()
	for deadline := time.Now().Add(30 * time.Second); ledger.in.Load() < 1; time.Sleep(5 * time.Millisecond) { // polling, not timing
		if time.Now().After(deadline) {
			t.Fatal("the PIX did not reach the ledger within 30s")
		}
	}
	for i := range 5 { // 100 tokens, 20 a miss
		if r := send(http.MethodGet, "/v1/pix/keys/ghost"+strconv.Itoa(i)+"@example.com", ""); r.Code != http.StatusNotFound {
			t.Fatalf("miss %d: %d %s", i+1, r.Code, r.Body)
		}
	}
	close(ledger.release)
	if r := <-held; r.Code != http.StatusTooManyRequests {
		t.Fatalf("the PIX to a key nobody has, its miss unpaid: %d %s, want 429", r.Code, r.Body)
	}
	rdb := srv.Client(nil)
	keys := rdb.Keys(t.Context(), "rl:pix:{*").Val()
	var logged int64
	for _, k := range keys {
		logged += rdb.ZCard(t.Context(), k).Val()
	}
	if logged != 0 {
		t.Errorf("the PIX limit's log holds %d entries (keys %v), want none: the PIX was refused", logged, keys)
	}
}
