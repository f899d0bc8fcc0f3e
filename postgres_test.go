package pixlimit_test

import (
	"math/rand/v2"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/pixlimit/pixlimit/internal/pgtest"
	"github.com/pixlimit/pixlimit/internal/redistest"
)

// TestPostgresFleet runs two API processes over one PostgreSQL and one Redis: what one replica
// writes, the other reads; an idempotent replay lands on either; the statement survives Redis
// going away and the ledger survives a restart.
func TestPostgresFleet(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	env := map[string]string{"DATABASE_URL": pgtest.URL(t)}
	a, b := startAPI(t, srv, env), startAPI(t, srv, env)

	ana := a.token(demo[0].document, demo[0].password)
	first := a.pix(ana, "carla@example.com", 1234, "Idempotency-Key", "fleet-1")
	if first.status != http.StatusCreated {
		t.Fatalf("PIX through A: %v", first)
	}
	id := first.json(t)["end_to_end_id"]
	st := b.statement(ana).json(t)
	if entries := st["entries"].([]any); len(entries) != 1 || entries[0].(map[string]any)["end_to_end_id"] != id {
		t.Errorf("B's statement %v, want A's transfer %v", st, id)
	}
	replay := b.pix(ana, "carla@example.com", 1234, "Idempotency-Key", "fleet-1")
	if replay.status != http.StatusCreated || string(replay.body) != string(first.body) {
		t.Errorf("replay through B: %v, want A's %v", replay, first)
	}
	if got := b.balance(ana); got != 1_000_000-1234 {
		t.Errorf("balance %d, want %d: the replay moved money", got, 1_000_000-1234)
	}

	srv.Kill()
	r := b.statement(ana)
	if r.status != http.StatusOK || r.header.Get("RateLimit-Limit") != "" || int64(r.json(t)["balance_cents"].(float64)) != 1_000_000-1234 {
		t.Errorf("statement with Redis down: %v %v, want 200 from PostgreSQL without RateLimit headers", r, r.header)
	}
	srv.Restart()

	// A new process on the same database finds everything where it was.
	c := startAPI(t, srv, env)
	if got := c.balance(c.token(demo[0].document, demo[0].password)); got != 1_000_000-1234 {
		t.Errorf("after a restart: balance %d, want %d", got, 1_000_000-1234)
	}
}

// TestPostgresFleetUnderLoad: 2 replicas × 8 goroutines × 100 random transfers among the demo
// accounts, limits raised. No 5xx, no negative balance, no money created or destroyed.
func TestPostgresFleetUnderLoad(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	env := map[string]string{"DATABASE_URL": pgtest.URL(t), "PIX_LIMIT": "100000", "STATEMENT_LIMIT": "100000", "LOG_LEVEL": "warn"}
	replicas := []*api{startAPI(t, srv, env), startAPI(t, srv, env)}
	tokens := make([]string, len(demo))
	for i, d := range demo {
		tokens[i] = replicas[i%2].token(d.document, d.password)
	}
	var mu sync.Mutex
	statuses := map[int]int{}
	var wg sync.WaitGroup
	start := time.Now()
	for r := range replicas {
		for g := range 8 {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(r), uint64(g)))
				for range 100 {
					from, to := rng.IntN(4), rng.IntN(4)
					resp := replicas[r].pix(tokens[from], demo[to].key, int64(1+rng.IntN(60_000)))
					mu.Lock()
					statuses[resp.status]++
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	elapsed := time.Since(start)
	t.Logf("1600 PIX requests over 2 replicas in %v: %.0f requests/s, %.0f transfers/s; statuses %v",
		elapsed.Round(time.Millisecond), 1600/elapsed.Seconds(), float64(statuses[201])/elapsed.Seconds(), statuses)
	for s, n := range statuses {
		if s != http.StatusCreated && s != http.StatusUnprocessableEntity {
			t.Errorf("%d × %d, want only 201 and 422", n, s)
		}
	}
	if statuses[201] < 600 {
		t.Errorf("only %d transfers: too few to prove anything", statuses[201])
	}
	var total int64
	for i, tok := range tokens {
		b := replicas[(i+1)%2].balance(tok)
		if b < 0 {
			t.Errorf("%s: negative balance %d", demo[i].name, b)
		}
		total += b
	}
	if total != 1_850_000 {
		t.Errorf("sum of balances %d, want 1850000", total)
	}
}
