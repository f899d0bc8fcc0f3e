package main

import (
	"crypto/rand"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pixlimit/pixlimit/internal/testing/apitest"
	"github.com/pixlimit/pixlimit/internal/testing/pgtest"
	"github.com/pixlimit/pixlimit/internal/testing/redistest"
)

// TestTiersChangeAtRuntime, over two replicas on one PostgreSQL: Ana uses 8 of her 10 PIX; support
// moves her to the restricted tier (5) on one replica's desk, and within two seconds the other
// replica refuses her next PIX with the tier's limit in RateLimit-Policy (what she used is kept);
// the premium tier (30) lets her on at once, counting what she used; an override of her own wins
// over the tier; GET /admin/v1/tiers lists them; unknown tiers and accounts are refused.
func TestTiersChangeAtRuntime(t *testing.T) {
	t.Parallel()
	srv, db := redistest.Start(t), pgtest.URL(t)
	token := rand.Text() + rand.Text()
	envA := map[string]string{"DATABASE_URL": db, "DEMO_ACCOUNTS": "true", "ADMIN_ADDR": apitest.FreeAddr(t), "ADMIN_TOKEN": token}
	a, b := startAPI(t, srv, envA), startAPI(t, srv, map[string]string{"DATABASE_URL": db, "DEMO_ACCOUNTS": "true"})
	desk := &apitest.Client{T: t, Base: "http://" + envA["ADMIN_ADDR"]}
	admin := func(method, path string, body any) apitest.Response {
		return desk.Do(method, path, body, "Authorization", "Bearer "+token)
	}
	ana := a.Token(demo[0].Document, demo[0].Password)
	for i := range 8 {
		if r := []*api{a, b}[i%2].PIX(ana, "bruno@example.com", 1); r.Status != http.StatusCreated {
			t.Fatalf("PIX %d: %v", i+1, r)
		}
	}
	if r := admin(http.MethodPut, "/admin/v1/accounts/acct-ana/tier", map[string]any{"tier": "restricted"}); r.Status != http.StatusOK {
		t.Fatalf("moving Ana to restricted: %v", r)
	}
	// b learns it by polling the version: the statement's policy tells when (restricted: 10).
	start := time.Now()
	for b.Statement(ana).Header.Get("RateLimit-Policy") != `"statement";q=10;w=60` {
		if time.Since(start) > 10*time.Second { // a bound, not the figure (logged below): a poll every 500 ms
			t.Fatal("the other replica did not apply the new tier within 10 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("the other replica applied the tier %v after the change", time.Since(start).Round(time.Millisecond))
	r := b.PIX(ana, "bruno@example.com", 1)
	if r.Status != http.StatusTooManyRequests || r.Header.Get("RateLimit-Policy") != `"pix";q=5;w=60` {
		t.Fatalf("Ana's 9th PIX on the restricted tier (5): %v %v, want 429 with q=5", r, r.Header)
	}
	if r := admin(http.MethodPut, "/admin/v1/accounts/acct-ana/tier", map[string]any{"tier": "premium"}); r.Status != http.StatusOK {
		t.Fatal(r)
	}
	r = a.PIX(ana, "bruno@example.com", 1) // the desk's replica refreshed at once
	if r.Status != http.StatusCreated || r.Header.Get("RateLimit-Policy") != `"pix";q=30;w=60` || r.Header.Get("RateLimit-Remaining") != "21" {
		t.Fatalf("on premium (30), after 8 used: %v %v, want 201 with 21 left", r, r.Header)
	}
	if r := admin(http.MethodPut, "/admin/v1/accounts/acct-ana/tier", map[string]any{"tier": "pf", "pix_limit": 12}); r.Status != http.StatusOK {
		t.Fatal(r)
	}
	if r := a.PIX(ana, "bruno@example.com", 1); r.Header.Get("RateLimit-Policy") != `"pix";q=12;w=60` || r.Header.Get("RateLimit-Remaining") != "2" {
		t.Errorf("with her own override of 12: %v %v, want q=12 and 2 left", r, r.Header)
	}
	r = admin(http.MethodGet, "/admin/v1/tiers", nil)
	if body := r.JSON(t); r.Status != http.StatusOK || len(body["tiers"].([]any)) != 5 || body["defaults"].(map[string]any)["pix_limit"] != 10.0 {
		t.Errorf("GET /admin/v1/tiers: %v", r)
	}
	for path, body := range map[string]map[string]any{
		"/admin/v1/accounts/acct-ana/tier":    {"tier": "gold"},
		"/admin/v1/accounts/acct-ana/tier#2":  {"tier": "premium", "pix_limit": -1},
		"/admin/v1/accounts/acct-ana/tier#3":  {},
		"/admin/v1/accounts/acct-nobody/tier": {"tier": "premium"},
	} {
		r := admin(http.MethodPut, strings.Split(path, "#")[0], body)
		if r.Status != http.StatusBadRequest && r.Status != http.StatusNotFound {
			t.Errorf("PUT %s %v: %v, want 400 or 404", path, body, r)
		}
	}
	if r := a.Do(http.MethodGet, "/admin/v1/tiers", nil, "Authorization", "Bearer "+token); r.Status != http.StatusNotFound {
		t.Errorf("tiers on the public listener: %v, want 404", r)
	}
}

// TestTheDesksReadTellsTheTierAndChangesNothing: Padaria, on the premium tier (30 PIX a minute),
// has sent 13. The desk reads her key as the route decides it: 30, 17 left, not full; and the
// read changes nothing a route answers: her next PIX goes through. (The desk used to check the
// key against the route's default of 10, report it full, and write that into the replica's
// memory of full keys, so her next PIX was refused for 5 s.) An account the ledger does not
// know is 404.
func TestTheDesksReadTellsTheTierAndChangesNothing(t *testing.T) {
	t.Parallel()
	token := rand.Text() + rand.Text()
	env := map[string]string{"DATABASE_URL": pgtest.URL(t), "DEMO_ACCOUNTS": "true", "ADMIN_ADDR": apitest.FreeAddr(t), "ADMIN_TOKEN": token}
	a := startAPI(t, redistest.Start(t), env)
	desk := &apitest.Client{T: t, Base: "http://" + env["ADMIN_ADDR"]}
	admin := func(method, path string, body any) apitest.Response {
		return desk.Do(method, path, body, "Authorization", "Bearer "+token)
	}
	if r := admin(http.MethodPut, "/admin/v1/accounts/acct-padaria/tier", map[string]any{"tier": "premium"}); r.Status != http.StatusOK {
		t.Fatalf("moving Padaria to premium: %v", r)
	}
	padaria := a.Token(demo[4].Document, demo[4].Password)
	for i := range 13 {
		if r := a.PIX(padaria, "ana@example.com", 1); r.Status != http.StatusCreated {
			t.Fatalf("Padaria's PIX %d: %v", i+1, r)
		}
	}
	r := admin(http.MethodGet, "/admin/v1/keys/pix/acct-padaria", nil)
	if body := r.JSON(t); r.Status != http.StatusOK || body["limit"] != 30.0 || body["remaining"] != 17.0 || body["full"] != false {
		t.Errorf("the desk's read of Padaria's key: %v, want limit 30, 17 left, not full", r)
	}
	if r := a.PIX(padaria, "ana@example.com", 1); r.Status != http.StatusCreated {
		t.Errorf("Padaria's PIX after the desk's read: %v, want 201", r)
	}
	if r := admin(http.MethodGet, "/admin/v1/keys/pix/acct-nobody", nil); r.Status != http.StatusNotFound {
		t.Errorf("an account the ledger does not know: %v, want 404", r)
	}
}

// TestAPayrollTierQueuesItsPIX: the desk moves the bakery to the payroll tier (a PIX queue of 30
// places at 60 PIX a window), read from PostgreSQL; its payroll of 40 PIX at once then goes
// through at the tier's pace, 31 served (one at once, 30 at their turns; one more per turn that
// passed while the 40 arrived, on a busy machine) and the rest refused. (No in-flight limit: its
// own test is beside; here transfers slowed by a busy machine would meet it at their turns.)
func TestAPayrollTierQueuesItsPIX(t *testing.T) {
	t.Parallel()
	token := rand.Text() + rand.Text()
	env := map[string]string{"DATABASE_URL": pgtest.URL(t), "DEMO_ACCOUNTS": "true", "ADMIN_ADDR": apitest.FreeAddr(t), "ADMIN_TOKEN": token,
		"PIX_WINDOW": "6s", "PIX_CONCURRENCY": "0"} // 60 a window: a turn every 100 ms
	a := startAPI(t, redistest.Start(t), env)
	desk := &apitest.Client{T: t, Base: "http://" + env["ADMIN_ADDR"]}
	if r := desk.Do(http.MethodPut, "/admin/v1/accounts/acct-padaria/tier", map[string]any{"tier": "payroll"}, "Authorization", "Bearer "+token); r.Status != http.StatusOK {
		t.Fatalf("moving the bakery to payroll: %v", r)
	}
	r := desk.Do(http.MethodGet, "/admin/v1/tiers", nil, "Authorization", "Bearer "+token)
	if !strings.Contains(string(r.Body), `"name":"payroll","pix_limit":60,"statement_limit":0,"lookup_capacity":0,"pix_queue":30`) {
		t.Errorf("GET /admin/v1/tiers: %s, want the payroll tier's queue", r.Body)
	}
	bakery := a.Token(demo[4].Document, demo[4].Password)
	start := time.Now()
	var mu sync.Mutex
	var lastRefusal time.Duration
	statuses := apitest.Burst([]*apitest.Client{a.Client}, 40, func(c *apitest.Client, i int) apitest.Response {
		r := c.PIX(bakery, "bruno@example.com", 1)
		if r.Status == http.StatusTooManyRequests {
			mu.Lock()
			lastRefusal = max(lastRefusal, time.Since(start))
			mu.Unlock()
		}
		return r
	})
	took := time.Since(start)
	passed := int(lastRefusal / (100 * time.Millisecond))
	if statuses[201] < 31 || statuses[201] > 31+passed || statuses[201]+statuses[429] != 40 {
		t.Fatalf("a payroll of 40 PIX at once: %v (%d turns passed while they arrived), want 31 × 201 and the rest 429", statuses, passed)
	}
	if took < 2700*time.Millisecond {
		t.Errorf("%d PIX served in %v: a queue at 100 ms a turn takes 3s", statuses[201], took)
	}
}

// TestARaisedTierNoLongerRefuses: Bruno at 10 of 10 PIX, refused on both replicas (each holds
// his key as full in its deny cache), is moved by the desk to premium (30): once the tier is in
// force on a replica (its q in RateLimit-Policy), that replica admits his next PIX, rather than
// refusing it from its memory of the full key with Retry-After up to a minute.
func TestARaisedTierNoLongerRefuses(t *testing.T) {
	t.Parallel()
	srv, db := redistest.Start(t), pgtest.URL(t)
	token := rand.Text() + rand.Text()
	envA := map[string]string{"DATABASE_URL": db, "DEMO_ACCOUNTS": "true", "ADMIN_ADDR": apitest.FreeAddr(t), "ADMIN_TOKEN": token, "PIX_CONCURRENCY": "0"}
	a, b := startAPI(t, srv, envA), startAPI(t, srv, map[string]string{"DATABASE_URL": db, "DEMO_ACCOUNTS": "true", "PIX_CONCURRENCY": "0"})
	desk := &apitest.Client{T: t, Base: "http://" + envA["ADMIN_ADDR"]}
	bruno := a.Token(demo[1].Document, demo[1].Password)
	for i := range 10 {
		if r := []*api{a, b}[i%2].PIX(bruno, "ana@example.com", 1); r.Status != http.StatusCreated {
			t.Fatalf("PIX %d: %v", i+1, r)
		}
	}
	for _, c := range []*api{a, b} {
		if r := c.PIX(bruno, "ana@example.com", 1); r.Status != http.StatusTooManyRequests {
			t.Fatalf("the 11th PIX: %v, want 429", r)
		}
	}
	if r := desk.Do(http.MethodPut, "/admin/v1/accounts/acct-bruno/tier", map[string]any{"tier": "premium"}, "Authorization", "Bearer "+token); r.Status != http.StatusOK {
		t.Fatalf("moving Bruno to premium: %v", r)
	}
	if r := a.PIX(bruno, "ana@example.com", 1); r.Status != http.StatusCreated || r.Header.Get("RateLimit-Policy") != `"pix";q=30;w=60` {
		t.Errorf("on the desk's replica, at once: %v %v, want 201 under q=30", r, r.Header)
	}
	start := time.Now()
	for {
		r := b.PIX(bruno, "ana@example.com", 1)
		if r.Header.Get("RateLimit-Policy") == `"pix";q=30;w=60` { // the tier in force on b
			if r.Status != http.StatusCreated {
				t.Errorf("on the other replica, its tier in force: %v %v, want 201", r, r.Header)
			}
			break
		}
		if time.Since(start) > 3*time.Second {
			t.Fatal("the other replica did not apply the new tier within 3 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
