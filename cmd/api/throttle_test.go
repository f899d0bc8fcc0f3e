package main

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pixlimit/pixlimit/internal/testing/apitest"
	"github.com/pixlimit/pixlimit/internal/testing/pgtest"
	"github.com/pixlimit/pixlimit/internal/testing/redistest"
)

// TestAKilledReplicasSlotsFreeAtTheirLease: a replica process holding both of Ana's in-flight
// slots (two PIX waiting on her account's row, which the test has locked) is killed with
// SIGKILL: nobody gives the slots back. Another replica refuses her PIX (pix-concurrency) until
// the slots' lease ends (CONCURRENCY_LEASE, 12s: it must outlast the longest PIX, 12s with the
// tests' REDIS_TIMEOUT of 1s and a DB_TIMEOUT of 4s, long enough for both PIX to be waiting on a
// busy machine), and serves it after, without a restart.
func TestAKilledReplicasSlotsFreeAtTheirLease(t *testing.T) {
	t.Parallel()
	srv, db := redistest.Start(t), pgtest.URL(t)
	env := map[string]string{"DATABASE_URL": db, "DEMO_ACCOUNTS": "true", "CONCURRENCY_LEASE": "12s", "DB_TIMEOUT": "4s"}
	survivor := startAPI(t, srv, env)

	addr := apitest.FreeAddr(t)
	victim := exec.Command(os.Args[0], "-test.run=^$")
	victim.Env = append(os.Environ(), "PIXLIMIT_RUN_MAIN=1", "HTTP_ADDR="+addr, "METRICS_ADDR=", "REDIS_URL=redis://"+srv.Addr(),
		"AUTH_SECRET="+testSecret, "DATABASE_URL="+db, "DEMO_ACCOUNTS=true", "CONCURRENCY_LEASE=12s", "DB_TIMEOUT=4s",
		"NIGHT_LIMIT_CENTS=0", "DAY_LIMIT_CENTS=0", "NEW_DEVICE_TRANSFER_LIMIT_CENTS=0", "NEW_DEVICE_DAY_LIMIT_CENTS=0")
	if err := victim.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = victim.Process.Kill(); _ = victim.Wait() })
	dying := &apitest.Client{T: t, Base: "http://" + addr}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if r, err := http.Get(dying.Base + "/healthz"); err == nil && r.StatusCode == http.StatusOK {
			r.Body.Close()
			break
		} else if time.Now().After(deadline) {
			t.Fatal("the victim replica did not start")
		}
	}

	// Ana's account row, locked: her PIX wait on it, in progress, each holding a slot.
	conn := pgtest.Connect(t, db)
	tx, err := conn.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.WithoutCancel(t.Context()))
	if _, err := tx.Exec(t.Context(), "SELECT 1 FROM accounts WHERE id = 'acct-ana' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	ana := survivor.Token(demo[0].Document, demo[0].Password)
	watcher := pgtest.Connect(t, db)
	for range 2 {
		go func() {
			req, _ := http.NewRequest(http.MethodPost, dying.Base+"/v1/pix", strings.NewReader(`{"key":"bruno@example.com","amount_cents":100}`))
			req.Header.Set("Authorization", "Bearer "+ana)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Idempotency-Key", apitest.NewIdempotencyKey())
			if r, err := http.DefaultClient.Do(req); err == nil { // the replica dies under it
				r.Body.Close()
			}
		}()
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var waiting int
		// This database's only: the other tests' databases share the server (and its pg_locks). On a
		// connection of its own: in the locking transaction, pg_stat_activity is one snapshot.
		if err := watcher.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d PIX waiting on Ana's row, want 2", waiting)
		}
	}
	if r := survivor.PIX(ana, "bruno@example.com", 100); r.Status != http.StatusTooManyRequests ||
		!strings.Contains(r.Header.Get("RateLimit-Policy"), `"pix-concurrency"`) {
		t.Fatalf("a PIX while two are in progress: %v %v, want 429 pix-concurrency", r, r.Header)
	}

	if err := victim.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = victim.Wait()
	killed := time.Now()
	if err := tx.Rollback(t.Context()); err != nil { // the dead replica's transfers never commit: their client is gone
		t.Fatal(err)
	}
	var r apitest.Response
	for r = survivor.PIX(ana, "bruno@example.com", 100); r.Status == http.StatusTooManyRequests; r = survivor.PIX(ana, "bruno@example.com", 100) {
		if time.Since(killed) > 14*time.Second {
			t.Fatalf("still refused %v after the replica died, with a lease of 12s: %v", time.Since(killed), r)
		}
		time.Sleep(100 * time.Millisecond) // a client retrying
	}
	if r.Status != http.StatusCreated {
		t.Errorf("a PIX once the dead replica's slots expired: %v, want 201", r)
	}
	t.Logf("served %v after the kill", time.Since(killed))
}

// TestAStoppingReplicaAnswersWhatItQueued: a replica stopped while a request waits in a queue
// for a turn 8 s away (more than the drain had, 7 s) answers it at its turn, then stops
// cleanly: the drain lasts the longest answer, so no request it accepted goes unanswered.
func TestAStoppingReplicaAnswersWhatItQueued(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	a, done := launch(t, ctx, srv, map[string]string{"STATEMENT_ALGORITHM": "leaky_bucket", "STATEMENT_LIMIT": "1",
		"STATEMENT_WINDOW": "8s", "STATEMENT_QUEUE": "1", "REDIS_TIMEOUT": "100ms"}) // the default timeout: a wait of up to 8.7 s
	diego := a.Token(demo[3].Document, demo[3].Password)
	if r := a.Statement(diego); r.Status != http.StatusOK {
		t.Fatalf("the first statement: %v, want 200 at once", r)
	}
	queued := make(chan apitest.Response, 1)
	go func() { queued <- a.Statement(diego) }()
	rdb := srv.Client(nil)
	waiting := func() bool { // the queue's sorted set holds both places: the second waits its turn
		keys, _ := rdb.Keys(t.Context(), "*statement*").Result()
		for _, k := range keys {
			if n, err := rdb.ZCard(t.Context(), k).Result(); err == nil && n == 2 {
				return true
			}
		}
		return false
	}
	for deadline := time.Now().Add(5 * time.Second); !waiting(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the second statement never took its place in the queue")
		}
	}
	stop()
	if r := <-queued; r.Status != http.StatusOK {
		t.Errorf("the queued statement, its replica stopping: %v, want 200 at its turn", r)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("api exit: %v, want nil: every request answered within the drain", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("api did not stop within 20s")
	}
}

// TestAQueuedPIXWhoseSlotRedisCannotDecideFailsClosed: a queued PIX (leaky_bucket, a turn every
// 3 s) takes its in-flight slot at its turn, in a call of its own. Redis stopped while it waits,
// that call fails, and the PIX's fail mode (closed, the default) answers: 429
// rate_limiter_unavailable, and no money moves, as for a PIX whose admission Redis could not
// decide (it went to the ledger with no slot and no mark, and moved the money).
func TestAQueuedPIXWhoseSlotRedisCannotDecideFailsClosed(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	a := startAPI(t, srv, map[string]string{"REDIS_TIMEOUT": "200ms", "PIX_ALGORITHM": "leaky_bucket",
		"PIX_LIMIT": "1", "PIX_WINDOW": "3s", "PIX_QUEUE": "2", "PIX_CONCURRENCY": "1", "RATELIMIT_BREAKER_FAILURES": "0"})
	ana := a.Token(demo[0].Document, demo[0].Password)
	before := a.Balance(ana)
	if r := a.PIX(ana, "bruno@example.com", 100); r.Status != http.StatusCreated {
		t.Fatalf("Ana's first PIX: %v", r)
	}
	queued := make(chan apitest.Response, 1)
	go func() { queued <- a.PIX(ana, "bruno@example.com", 100) }()
	rdb := srv.Client(nil)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) { // until it waits its turn
		keys := rdb.Keys(t.Context(), "rl:pix:leaky_bucket:*").Val()
		if len(keys) == 1 && rdb.ZCount(t.Context(), keys[0], "("+strconv.FormatInt(time.Now().UnixMicro(), 10), "+inf").Val() == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("Ana's second PIX not waiting its turn within 10s")
		}
	}
	srv.Kill()
	r := <-queued
	srv.Restart()
	if r.Status != http.StatusTooManyRequests || r.JSON(t)["error"] != "rate_limiter_unavailable" {
		t.Errorf("Ana's queued PIX, Redis stopped before its turn: %v, want 429 rate_limiter_unavailable (PIX_FAIL_MODE closed)", r)
	}
	if got, want := a.Balance(ana), before-100; got != want {
		t.Errorf("Ana's balance %d, want %d: only her first PIX moved money", got, want)
	}
}
