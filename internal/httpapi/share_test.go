package httpapi_test

import (
	"context"
	"fmt"
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
	"github.com/pixlimit/pixlimit/internal/enforce"
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

// heldShare serves s's routes over a share of the ledger of two places per account, each waited
// for at most wait, with Ana's two held by PIX in the ledger (logged to logs; the server has the
// deny cache a replica has). login sends a login from 198.51.100.9; release lets the PIX go on,
// each 201, and waits for them (the test's end does it, if not before).
func heldShare(t *testing.T, s server, limits enforce.RouteLimits, wait time.Duration, logs *apitest.Logs) (login func(document, password string) *httptest.ResponseRecorder, release func()) {
	t.Helper()
	ledger := &stuckTransfers{MemoryLedger: s.ledger, release: make(chan struct{})}
	share, err := pix.NewShare(2, wait)
	if err != nil {
		t.Fatal(err)
	}
	h, err := httpapi.NewServer(httpapi.Deps{Logger: slog.New(slog.NewTextHandler(logs, nil)), Limiter: s.limiter, Stack: s.stack, DenyCache: s.cache,
		Limits: limits, Ledger: pix.Shared(ledger, share), Share: share, Tokens: s.tokens, Devices: s.devices, Passwords: s.passwords})
	if err != nil {
		t.Fatal(err)
	}
	document, _, err := pix.ParseDocument(apitest.Demo[0].Document)
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
	var once sync.Once
	release = func() { once.Do(func() { close(ledger.release); pixes.Wait() }) }
	t.Cleanup(release)
	inLedger(t, ledger, 2)
	return func(document, password string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/v1/login", strings.NewReader(`{"document":"`+document+`","password":"`+password+`"}`))
		req.RemoteAddr = "198.51.100.9:1234"
		return serve(req)
	}, release
}

// TestALoginTakesItsAccountsShareOfTheLedger: a login's look-up takes a place of the same share
// of the ledger as its account's calls: with Ana's two places held by two PIX in progress, a login
// to her document waits its turn and is 503 ledger_busy, having asked the ledger nothing (it took
// a place of its own, and one account held twice its share), and not logged as an error of the
// server, and spent none of its keys' quota (withdrawn); Bruno's login is served.
func TestALoginTakesItsAccountsShareOfTheLedger(t *testing.T) {
	t.Parallel()
	logs := &apitest.Logs{}
	login, _ := heldShare(t, newServer(t, redistest.Start(t), lax()), lax(), 200*time.Millisecond, logs)
	ana, bruno := apitest.Demo[0], apitest.Demo[1]
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

// TestAShedLoginsRoomIsNotRefusedFromMemory: Ana's document key admits one login a minute. Her
// first login, admitted, waits for a place of her share of the ledger (two PIX hold both) and is
// shed, 503; meanwhile a second login was refused by the key, which the deny cache learnt. The
// shed login's admission is withdrawn, and the cache forgets the key with it: once the PIX are
// done, her next login is decided by Redis, which has room, not refused from memory.
func TestAShedLoginsRoomIsNotRefusedFromMemory(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	limits := lax()
	limits.LoginAccount.Policy.Limit = 1
	login, release := heldShare(t, newServer(t, srv, limits), limits, 2*time.Second, &apitest.Logs{})
	ana := apitest.Demo[0]
	shed := make(chan *httptest.ResponseRecorder, 1)
	go func() { shed <- login(ana.Document, ana.Password) }()
	rdb := srv.Client(nil)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) { // its admission recorded
		if keys := rdb.Keys(t.Context(), "rl:login-account:*").Val(); len(keys) == 1 && rdb.ZCard(t.Context(), keys[0]).Val() == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("Ana's first login not admitted within 10s")
		}
	}
	if r := login(ana.Document, ana.Password); r.Code != http.StatusTooManyRequests {
		t.Fatalf("Ana's second login, her key full: %d %s, want 429", r.Code, r.Body)
	}
	if r := <-shed; r.Code != http.StatusServiceUnavailable {
		t.Fatalf("Ana's first login, her places held: %d %s, want 503", r.Code, r.Body)
	}
	release()
	if r := login(ana.Document, ana.Password); r.Code != http.StatusOK {
		t.Errorf("Ana's login after her shed one was withdrawn: %d %s (RateLimit-Policy %q), want 200: Redis has room", r.Code, r.Body, r.Header().Get("RateLimit-Policy"))
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
	h, err := httpapi.NewServer(httpapi.Deps{Logger: slog.New(slog.DiscardHandler), Limiter: s.limiter, Stack: s.stack, DenyCache: s.cache,
		Limits: limits, Ledger: ledger, Tokens: s.tokens, Devices: s.devices, Passwords: s.passwords})
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

// pixServer is a server over s's limiter whose ledger holds every transfer until released, and
// Diego's PIX sender: a PIX of its own Idempotency-Key, to key, for cents.
func pixServer(t *testing.T, s server, limits enforce.RouteLimits) (*stuckTransfers, func(key string, cents int64) *httptest.ResponseRecorder, func(method, path string) *httptest.ResponseRecorder) {
	t.Helper()
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
	pay := func(key string, cents int64) *httptest.ResponseRecorder {
		return send(http.MethodPost, "/v1/pix", fmt.Sprintf(`{"key":%q,"amount_cents":%d}`, key, cents))
	}
	return ledger, pay, func(method, path string) *httptest.ResponseRecorder { return send(method, path, "") }
}

// inLedger waits until n transfers are held in ledger (polling, not timing).
func inLedger(t *testing.T, ledger *stuckTransfers, n int32) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ledger.in.Load() < n; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d PIX in the ledger within 30s, want %d", ledger.in.Load(), n)
		}
	}
}

// TestAPIXPaysItsMissBeforeTheLedger: each of Diego's PIX takes a miss's price (20 of his 100
// look-up tokens) in its admission, before the ledger: with two held there, one to a key nobody
// has and one to Bruno's, three look-ups of unknown keys empty his bucket and the fourth is
// refused. Released, the first is 404, having paid once, and the second 201, its price given
// back: one more miss is answered, and the next refused.
func TestAPIXPaysItsMissBeforeTheLedger(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	limits := lax()
	s := newServer(t, srv, limits)
	ledger, pay, get := pixServer(t, s, limits)
	miss, hit := make(chan *httptest.ResponseRecorder, 1), make(chan *httptest.ResponseRecorder, 1)
	go func() { miss <- pay("nobody@example.com", 100) }()
	go func() { hit <- pay("bruno@example.com", 100) }()
	inLedger(t, ledger, 2)
	lookUps := func(from int, want ...int) {
		t.Helper()
		for i, code := range want {
			if r := get(http.MethodGet, "/v1/pix/keys/ghost"+strconv.Itoa(from+i)+"@example.com"); r.Code != code {
				t.Fatalf("look-up %d of an unknown key: %d %s, want %d", from+i+1, r.Code, r.Body, code)
			}
		}
	}
	lookUps(0, http.StatusNotFound, http.StatusNotFound, http.StatusNotFound, http.StatusTooManyRequests) // 60 tokens: three misses
	close(ledger.release)
	if r := <-miss; r.Code != http.StatusNotFound {
		t.Fatalf("the PIX to a key nobody has: %d %s, want 404 (its miss paid before the ledger)", r.Code, r.Body)
	}
	if r := <-hit; r.Code != http.StatusCreated {
		t.Fatalf("the PIX to Bruno: %d %s, want 201", r.Code, r.Body)
	}
	lookUps(4, http.StatusNotFound, http.StatusTooManyRequests) // the 20 the payment gave back: one miss
	rdb := srv.Client(nil)
	keys := rdb.Keys(t.Context(), "rl:pix:{*").Val()
	if len(keys) != 1 || rdb.ZCard(t.Context(), keys[0]).Val() != 2 {
		t.Errorf("the PIX limit's log: keys %v, want one of two entries (both PIX, admitted)", keys)
	}
}

// TestPIXSentTogetherLearnNoMoreKeysThanOneByOne: Diego's look-up bucket holds 100 tokens, five
// misses. Five PIX to keys nobody has, held in the ledger, have taken them all; a PIX to a key
// that exists is then refused 429 before the ledger, as one to a key nobody has is: one by one,
// after five misses every PIX is 429 whatever its key, and PIX sent together learn no more. (Paid
// after the ledger, the misses had taken nothing yet, and the PIX to a found key was answered:
// sent beside misses, a PIX told which keys exist for the price of five.)
func TestPIXSentTogetherLearnNoMoreKeysThanOneByOne(t *testing.T) {
	t.Parallel()
	limits := lax()
	s := newServer(t, redistest.Start(t), limits)
	ledger, pay, _ := pixServer(t, s, limits)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer func() { close(ledger.release) }()
	for i := range 5 {
		wg.Go(func() {
			if r := pay(fmt.Sprintf("ghost%d@example.com", i), 100); r.Code != http.StatusNotFound {
				t.Errorf("PIX %d to a key nobody has: %d %s, want 404", i+1, r.Code, r.Body)
			}
		})
	}
	inLedger(t, ledger, 5)
	for _, key := range []string{"bruno@example.com", "ghost9@example.com", "ana@example.com"} {
		answered := make(chan *httptest.ResponseRecorder, 1)
		go func() { answered <- pay(key, 99_999_999_999) }()
		for deadline := time.Now().Add(30 * time.Second); len(answered) == 0; time.Sleep(time.Millisecond) {
			if n := ledger.in.Load(); n > 5 || time.Now().After(deadline) {
				t.Fatalf("PIX to %s, five misses' prices taken: unanswered, %d PIX in the ledger; want 429 before the ledger", key, n)
			}
		}
		if r := <-answered; r.Code != http.StatusTooManyRequests || !strings.HasPrefix(r.Header().Get("RateLimit-Policy"), `"pix-lookup"`) {
			t.Errorf("PIX to %s, five misses' prices taken: %d %s, want 429 by pix-lookup", key, r.Code, r.Body)
		}
	}
	if n := ledger.in.Load(); n != 5 {
		t.Errorf("%d PIX reached the ledger, want 5", n)
	}
}
