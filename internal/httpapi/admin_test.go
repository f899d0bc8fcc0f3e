package httpapi_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pixlimit/pixlimit/internal/httpapi"
	"github.com/pixlimit/pixlimit/internal/pix"
	"github.com/pixlimit/pixlimit/internal/ratelimit"
	"github.com/pixlimit/pixlimit/internal/testing/redistest"
)

// unaudited is a ledger whose audit log stops storing records when down is set.
type unaudited struct {
	*pix.MemoryLedger
	down atomic.Bool
}

func (u *unaudited) Audit(ctx context.Context, rec pix.AuditRecord) error {
	if u.down.Load() {
		return pix.ErrUnavailable
	}
	return u.MemoryLedger.Audit(ctx, rec)
}

// TestNoDeskReadIsServedUnaudited: every desk call is audited, reads too: a read whose record
// cannot be stored is not served (503 ledger_unavailable, the answer it would have had held back),
// as a change whose record cannot be stored is not made.
func TestNoDeskReadIsServedUnaudited(t *testing.T) {
	t.Parallel()
	s := newServer(t, redistest.Start(t), lax())
	ledger := &unaudited{MemoryLedger: s.ledger}
	desk, token := newDeskOver(t, s, ledger)
	read := func() *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodGet, "/admin/v1/tiers", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		rec := httptest.NewRecorder()
		desk.ServeHTTP(rec, req)
		return rec
	}
	if r := read(); r.Code != http.StatusOK || !strings.Contains(r.Body.String(), `"tiers"`) || r.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("a read, its record stored: %d %q %s, want 200 with the tiers, as JSON", r.Code, r.Header().Get("Content-Type"), r.Body)
	}
	trail, _ := s.ledger.AuditTrail(t.Context(), 10)
	if len(trail) != 1 || trail[0].Action != "GET /admin/v1/tiers" || trail[0].Outcome != pix.OutcomeDone {
		t.Errorf("the audit trail after one read: %+v, want its one done record", trail)
	}
	ledger.down.Store(true)
	if r := read(); r.Code != http.StatusServiceUnavailable || !strings.Contains(r.Body.String(), `"ledger_unavailable"`) || strings.Contains(r.Body.String(), `"tiers"`) {
		t.Errorf("a read whose record cannot be stored: %d %s, want 503 ledger_unavailable and no tiers", r.Code, r.Body)
	}
}

// TestADeskApprovalAuditsTheDevicesStateBefore: the audit record of a desk's approval says what
// the device was before, as the ledger had it: pending, registered already (an approval again
// changes nothing), or never asked.
func TestADeskApprovalAuditsTheDevicesStateBefore(t *testing.T) {
	t.Parallel()
	s := newServer(t, redistest.Start(t), lax())
	desk, token := newDesk(t, s)
	if _, err := s.ledger.RegisterDevice(t.Context(), "acct-ana", "phone", time.Hour); err != nil { // her first: registered at once
		t.Fatal(err)
	}
	if _, err := s.ledger.RegisterDevice(t.Context(), "acct-ana", "laptop", time.Hour); err != nil { // pending a day
		t.Fatal(err)
	}
	for _, tt := range []struct {
		device string
		status int
		before string
	}{
		{"laptop", http.StatusOK, `"registered":false`},
		{"laptop", http.StatusOK, `"registered":true`}, // approved again
		{"phone", http.StatusOK, `"registered":true`},
		{"tablet", http.StatusNotFound, `{"requested":false}`},
	} {
		req := httptest.NewRequest(http.MethodPost, "/admin/v1/accounts/acct-ana/devices/"+tt.device+"/approve", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		rec := httptest.NewRecorder()
		desk.ServeHTTP(rec, req)
		trail, _ := s.ledger.AuditTrail(t.Context(), 1)
		if rec.Code != tt.status || len(trail) != 1 || !strings.Contains(trail[0].Before, tt.before) {
			t.Errorf("approving %s: %d, audited before %+v, want %d and %s", tt.device, rec.Code, trail, tt.status, tt.before)
		}
	}
}

// TestTheDeskKnowsNoMadeUpAccount: a key named by an account the ledger does not have is 404
// not_found, for the account's settings key as for its PIX and statement keys (the settings key
// was read, and cleared, for any made-up account); a real account's is 200.
func TestTheDeskKnowsNoMadeUpAccount(t *testing.T) {
	t.Parallel()
	s := newServer(t, redistest.Start(t), lax())
	desk, token := newDesk(t, s)
	settings := lax().Settings.Policy.Name
	for _, tt := range []struct {
		method, path string
		want         int
	}{
		{http.MethodGet, "/admin/v1/keys/" + settings + "/acct-nobody/DEVICE1", http.StatusNotFound},
		{http.MethodDelete, "/admin/v1/keys/" + settings + "/acct-nobody/DEVICE1", http.StatusNotFound},
		{http.MethodGet, "/admin/v1/keys/" + lax().PIX.Policy.Name + "/acct-nobody", http.StatusNotFound},
		{http.MethodGet, "/admin/v1/keys/" + settings + "/acct-ana/DEVICE1", http.StatusOK},
	} {
		req := httptest.NewRequest(tt.method, tt.path, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		rec := httptest.NewRecorder()
		desk.ServeHTTP(rec, req)
		if rec.Code != tt.want || tt.want == http.StatusNotFound && !strings.Contains(rec.Body.String(), `"not_found"`) {
			t.Errorf("%s %s: %d %s, want %d", tt.method, tt.path, rec.Code, rec.Body, tt.want)
		}
	}
}

// TestNoDeskAnswerIsStored: the desk's answers (key states, tiers, its refusals) carry
// Cache-Control: no-store and nosniff, as the API's do, a refusal (429) but.
func TestNoDeskAnswerIsStored(t *testing.T) {
	t.Parallel()
	s := newServer(t, redistest.Start(t), lax())
	desk, token := newDesk(t, s)
	for _, tt := range []struct {
		path, token string
		want        int
	}{
		{"/admin/v1/tiers", token, http.StatusOK},
		{"/admin/v1/keys/" + lax().PIX.Policy.Name + "/acct-ana", token, http.StatusOK},
		{"/admin/v1/nowhere", token, http.StatusNotFound},
		{"/admin/v1/tiers", "wrong", http.StatusUnauthorized},
	} {
		req := httptest.NewRequest(http.MethodGet, tt.path, nil)
		req.Header.Set("Authorization", "Bearer "+tt.token)
		rec := httptest.NewRecorder()
		desk.ServeHTTP(rec, req)
		got := [2]string{rec.Header().Get("Cache-Control"), rec.Header().Get("X-Content-Type-Options")}
		if want := [2]string{"no-store", "nosniff"}; rec.Code != tt.want || got != want {
			t.Errorf("GET %s: %d, Cache-Control and X-Content-Type-Options %q; want %d, %q", tt.path, rec.Code, got, tt.want, want)
		}
	}
}

// newDesk is a support desk over s's limiter and ledger, and its token.
func newDesk(t *testing.T, s server) (*httpapi.Admin, string) {
	t.Helper()
	return newDeskOver(t, s, s.ledger)
}

// newDeskOver is newDesk over ledger, its audit trail's and its tiers'.
func newDeskOver(t *testing.T, s server, ledger pix.Ledger) (*httpapi.Admin, string) {
	t.Helper()
	tiers := pix.NewTiers(t.Context(), ledger, slog.New(slog.DiscardHandler), time.Hour)
	t.Cleanup(tiers.Close)
	token := rand.Text() + rand.Text()
	desk, err := httpapi.NewAdmin(httpapi.AdminDeps{Logger: slog.New(slog.DiscardHandler), Limiter: s.limiter, Limits: lax(),
		Ledger: ledger, Tokens: s.tokens, Token: token, Tiers: tiers, AuditKey: []byte("an-audit-key-16b")})
	if err != nil {
		t.Fatal(err)
	}
	return desk, token
}

// deskFaults is a ledger whose tier changes are made but not confirmed (unconfirmed), whose tier
// table cannot be read again once stale is set, and whose revocations panic (a bug below).
type deskFaults struct {
	*pix.MemoryLedger
	unconfirmed, stale atomic.Bool
}

func (f *deskFaults) SetTier(ctx context.Context, id string, a pix.TierOf) error {
	err := f.MemoryLedger.SetTier(ctx, id, a)
	if err == nil && f.unconfirmed.Load() {
		return fmt.Errorf("%w: COMMIT sent, no answer", pix.ErrChangeOutcomeUnknown)
	}
	return err
}

func (f *deskFaults) TierTable(ctx context.Context) (pix.TierTable, error) {
	if f.stale.Load() {
		return pix.TierTable{}, pix.ErrUnavailable
	}
	return f.MemoryLedger.TierTable(ctx)
}

func (f *deskFaults) RevokeDevices(context.Context, string) (pix.Revocation, error) {
	panic("a bug below the desk")
}

// TestTheDeskAuditsWhatItKnows: a desk change's audit record says what happened as far as the
// replica knows it: a change the ledger made but could not confirm is answered 503
// change_outcome_unknown and audited "unknown", never "failed" (nothing changed); a change made
// while this replica cannot read its tier table again is audited with what was written, not the
// stale table's; and a panic below the desk, once the change is under way, is a 500 audited
// "unknown", not a connection cut unrecorded.
func TestTheDeskAuditsWhatItKnows(t *testing.T) {
	t.Parallel()
	s := newServer(t, redistest.Start(t), lax())
	ledger := &deskFaults{MemoryLedger: s.ledger}
	desk, token := newDeskOver(t, s, ledger)
	call := func(method, path, body string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		desk.ServeHTTP(rec, req)
		return rec
	}
	last := func() pix.AuditRecord {
		trail, err := s.ledger.AuditTrail(t.Context(), 1)
		if err != nil || len(trail) != 1 {
			t.Fatalf("audit trail: %v, %v", trail, err)
		}
		return trail[0]
	}
	ledger.unconfirmed.Store(true)
	if r := call(http.MethodPut, "/admin/v1/accounts/acct-ana/tier", `{"tier":"premium"}`); r.Code != http.StatusServiceUnavailable ||
		!strings.Contains(r.Body.String(), `"change_outcome_unknown"`) || r.Header().Get("Retry-After") == "" {
		t.Errorf("a tier change made, not confirmed: %d %s, want 503 change_outcome_unknown with Retry-After", r.Code, r.Body)
	}
	if rec := last(); rec.Outcome != pix.OutcomeUnknown {
		t.Errorf("its audit record: %+v, want outcome unknown", rec)
	}
	ledger.unconfirmed.Store(false)
	ledger.stale.Store(true)
	if r := call(http.MethodPut, "/admin/v1/accounts/acct-bruno/tier", `{"tier":"premium"}`); r.Code != http.StatusOK {
		t.Fatalf("a tier change, the table not read again: %d %s, want 200", r.Code, r.Body)
	}
	if rec := last(); rec.Outcome != pix.OutcomeDone || !strings.Contains(rec.After, `"premium"`) {
		t.Errorf("its audit record: %+v, want done, after naming premium (what was written)", rec)
	}
	if r := call(http.MethodDelete, "/admin/v1/accounts/acct-ana/devices", ""); r.Code != http.StatusInternalServerError {
		t.Errorf("a revocation that panics: %d %s, want 500", r.Code, r.Body)
	}
	if rec := last(); rec.Outcome != pix.OutcomeUnknown || rec.Status != http.StatusInternalServerError {
		t.Errorf("its audit record: %+v, want unknown (the bug struck once the change was under way), 500", rec)
	}
}

// cutAtChange is a ledger that cuts the link to Redis once a desk change's requested record is
// stored: the change's own call to Redis is then sent into the cut.
type cutAtChange struct {
	*pix.MemoryLedger
	link *redistest.Link
}

func (c *cutAtChange) Audit(ctx context.Context, rec pix.AuditRecord) error {
	err := c.MemoryLedger.Audit(ctx, rec)
	if rec.Outcome == pix.OutcomeRequested {
		c.link.Cut()
	}
	return err
}

// TestAKeyResetCutOffMayHaveBeenMade: a desk's reset of a key whose call to Redis was sent and not
// answered (the network cut as it went) is answered 503 change_outcome_unknown and audited
// "unknown", not "failed": once the network heals, Redis runs the held call, and the key is
// cleared after all.
func TestAKeyResetCutOffMayHaveBeenMade(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	link := srv.Link()
	s := newServer(t, srv, lax())
	opts := &redis.Options{Addr: link.Addr()} // the desk's Redis, through the link
	ratelimit.ClientOptions(opts, 300*time.Millisecond)
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })
	limiter, err := ratelimit.New(rdb, ratelimit.Options{KeySecret: []byte("a-key-secret-of-16+b"), Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	s.limiter = limiter
	ledger := &cutAtChange{MemoryLedger: s.ledger, link: link}
	desk, token := newDeskOver(t, s, ledger)
	ip := ratelimit.Check{Policy: lax().LoginIP.Policy, Identity: "203.0.113.7"}
	if d, err := limiter.AllowAll(t.Context(), ip); err != nil || !d.Allowed {
		t.Fatalf("a login's decision: %+v, %v", d, err)
	}
	if err := limiter.Forget(t.Context(), ratelimit.Check{Policy: ip.Policy, Identity: "198.51.100.1"}); err != nil {
		t.Fatal(err) // the reset's script loaded, as a replica's warm-up loads it: held, its hash alone is sent
	}
	req := httptest.NewRequest(http.MethodDelete, "/admin/v1/keys/login-ip/203.0.113.7", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	rec := httptest.NewRecorder()
	desk.ServeHTTP(rec, req)
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), `"change_outcome_unknown"`) {
		t.Errorf("a reset cut off on its way: %d %s, want 503 change_outcome_unknown", rec.Code, rec.Body)
	}
	if trail, _ := s.ledger.AuditTrail(t.Context(), 1); len(trail) != 1 || trail[0].Outcome != pix.OutcomeUnknown {
		t.Errorf("its audit record: %+v, want unknown", trail)
	}
	link.Heal()
	if d, err := limiter.AllowAll(t.Context(), ip); err != nil || d.Worst.Remaining != ip.Policy.Limit-1 {
		t.Errorf("the key once healed: %+v, %v; want it cleared by the held reset (%d left after this decision)", d.Worst, err, ip.Policy.Limit-1)
	}
}
