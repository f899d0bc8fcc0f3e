package main

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pixlimit/pixlimit/internal/testing/apitest"
	"github.com/pixlimit/pixlimit/internal/testing/pgtest"
	"github.com/pixlimit/pixlimit/internal/testing/redistest"
	"github.com/pixlimit/pixlimit/internal/testing/stalls"
)

// TestPostgresFleet runs two API processes over one PostgreSQL and one Redis: what one replica
// writes, the other reads; an idempotent replay lands on either; the statement survives Redis
// going away and the ledger survives a restart.
func TestPostgresFleet(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	env := map[string]string{"DATABASE_URL": pgtest.URL(t), "DEMO_ACCOUNTS": "true"}
	a, b := startAPI(t, srv, env), startAPI(t, srv, env)

	ana := a.Token(demo[0].Document, demo[0].Password)
	first := a.PIX(ana, "carla@example.com", 1234, "Idempotency-Key", "fleet-1")
	if first.Status != http.StatusCreated {
		t.Fatalf("PIX through A: %v", first)
	}
	id := first.JSON(t)["end_to_end_id"]
	st := b.Statement(ana).JSON(t)
	if entries := st["entries"].([]any); len(entries) != 1 || entries[0].(map[string]any)["end_to_end_id"] != id {
		t.Errorf("B's statement %v, want A's transfer %v", st, id)
	}
	replay := b.PIX(ana, "carla@example.com", 1234, "Idempotency-Key", "fleet-1")
	if replay.Status != http.StatusCreated || string(replay.Body) != string(first.Body) {
		t.Errorf("replay through B: %v, want A's %v", replay, first)
	}
	if got := b.Balance(ana); got != 1_000_000-1234 {
		t.Errorf("balance %d, want %d: the replay moved money", got, 1_000_000-1234)
	}

	srv.Kill()
	r := b.Statement(ana)
	if r.Status != http.StatusOK || r.Header.Get("RateLimit-Limit") != "15" || int64(r.JSON(t)["balance_cents"].(float64)) != 1_000_000-1234 {
		t.Errorf("statement with Redis down: %v %v, want 200 from PostgreSQL, decided by the fallback at half the limit (two replicas)", r, r.Header)
	}
	srv.Restart()

	// A new process on the same database finds everything where it was.
	c := startAPI(t, srv, env)
	if got := c.Balance(c.Token(demo[0].Document, demo[0].Password)); got != 1_000_000-1234 {
		t.Errorf("after a restart: balance %d, want %d", got, 1_000_000-1234)
	}
}

// TestPostgresFleetUnderLoad: 2 replicas × 8 goroutines × 100 random transfers among the demo
// accounts, limits raised. No 5xx, no negative balance, no money created or destroyed.
func TestPostgresFleetUnderLoad(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	env := map[string]string{"DATABASE_URL": pgtest.URL(t), "DEMO_ACCOUNTS": "true", "PIX_LIMIT": "100000", "PIX_CONCURRENCY": "0", "STATEMENT_LIMIT": "100000", "LOG_LEVEL": "warn",
		// The point is the money, not the latency: a machine four times busier (load 11 on two
		// cores) answered 11 of 1,600 PIX 503 at the default 2s, each honestly, none a lost cent.
		"DB_TIMEOUT": "4s"}
	replicas := []*api{startAPI(t, srv, env), startAPI(t, srv, env)}
	tokens := make([]string, len(demo))
	for i, d := range demo {
		tokens[i] = replicas[i%2].Token(d.Document, d.Password)
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
					resp := replicas[r].PIX(tokens[from], demo[to].Key, int64(1+rng.IntN(60_000)))
					mu.Lock()
					statuses[resp.Status]++
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
		b := replicas[(i+1)%2].Balance(tok)
		if b < 0 {
			t.Errorf("%s: negative balance %d", demo[i].Name, b)
		}
		total += b
	}
	if want := demoOpening(); total != want {
		t.Errorf("sum of balances %d, want %d", total, want)
	}
}

// TestAHungDatabaseDoesNotHangTheAPI freezes PostgreSQL (a gate in front of it stops passing
// bytes, as SIGSTOP would): login, PIX and statement each answer 503 ledger_unavailable with
// Retry-After within about DB_TIMEOUT, and everything works again once it thaws. The PIX that
// failed is retried with its Idempotency-Key and moves money once.
func TestAHungDatabaseDoesNotHangTheAPI(t *testing.T) {
	t.Parallel()
	gate := pgtest.NewGate(t, pgtest.URL(t))
	a := startAPI(t, redistest.Start(t), map[string]string{
		"DATABASE_URL": gate.URL, "DEMO_ACCOUNTS": "true", "DB_TIMEOUT": "300ms",
	})
	ana := a.Token(demo[0].Document, demo[0].Password)

	meter := stalls.Watch(t)
	gate.Close()
	for name, send := range map[string]func() apitest.Response{
		"login":     func() apitest.Response { return a.Login(demo[1].Document, demo[1].Password) },
		"PIX":       func() apitest.Response { return a.PIX(ana, "bruno@example.com", 700, "Idempotency-Key", "hung-1") },
		"statement": func() apitest.Response { return a.Statement(ana) },
	} {
		r := send()
		if r.Status != http.StatusServiceUnavailable || r.JSON(t)["error"] != "ledger_unavailable" || r.Header.Get("Retry-After") != "1" {
			t.Errorf("%s with the database frozen: %v Retry-After %q, want 503 ledger_unavailable, Retry-After 1",
				name, r, r.Header.Get("Retry-After"))
		}
		if took := meter.Just(r.Took); took > 2*time.Second { // the machine's own stalls aside
			t.Errorf("%s took %v with DB_TIMEOUT 300ms", name, took)
		}
	}
	gate.Open()

	// The first calls after the thaw may still miss the 300 ms on a loaded machine, and say so.
	retry := func() apitest.Response { return a.PIX(ana, "bruno@example.com", 700, "Idempotency-Key", "hung-1") }
	if r := apitest.UntilAnswered(t, retry); r.Status != http.StatusCreated {
		t.Fatalf("the retry after the thaw: %v, want 201", r)
	}
	if r := apitest.UntilAnswered(t, retry); r.Status != http.StatusCreated {
		t.Fatalf("a second retry: %v, want the original 201", r)
	}
	if got := a.Balance(ana); got != 1_000_000-700 {
		t.Errorf("balance %d, want %d: one transfer", got, 1_000_000-700)
	}
}

// TestConcurrentRetriesGetTheOriginalAnswer: 20 PIX requests at once with one Idempotency-Key,
// for an amount Diego's balance covers once: every one is the original 201, none a 422.
func TestConcurrentRetriesGetTheOriginalAnswer(t *testing.T) {
	t.Parallel()
	env := map[string]string{"DATABASE_URL": pgtest.URL(t), "DEMO_ACCOUNTS": "true", "PIX_LIMIT": "100"}
	a := startAPI(t, redistest.Start(t), env)
	diego := a.Token(demo[3].Document, demo[3].Password)
	bodies := map[string]int{}
	var mu sync.Mutex
	statuses := apitest.Burst([]*apitest.Client{a.Client}, 20, func(c *apitest.Client, _ int) apitest.Response {
		r := c.PIX(diego, "ana@example.com", 60_000, "Idempotency-Key", "retry-after-timeout")
		mu.Lock()
		bodies[string(r.Body)]++
		mu.Unlock()
		return r
	})
	if statuses[http.StatusCreated] != 20 || len(bodies) != 1 {
		t.Errorf("statuses %v with %d distinct bodies, want 20 × 201, one body", statuses, len(bodies))
	}
	if got := a.Balance(diego); got != 40_000 {
		t.Errorf("Diego's balance %d, want 40000", got)
	}
}

// TestDemoAccountsAreNotSeededIntoARealDatabaseByDefault: DATABASE_URL set and DEMO_ACCOUNTS
// unset, the published demo passwords open nothing.
func TestDemoAccountsAreNotSeededIntoARealDatabaseByDefault(t *testing.T) {
	t.Parallel()
	a := startAPI(t, redistest.Start(t), map[string]string{"DATABASE_URL": pgtest.URL(t)})
	if r := a.Login(demo[0].Document, demo[0].Password); r.Status != http.StatusUnauthorized {
		t.Errorf("Ana's published password: %v, want 401", r)
	}
	if strings.Contains(a.logs.String(), "seeding the demo accounts") {
		t.Errorf("the log says demo accounts were seeded:\n%s", a.logs)
	}
}

// TestALostDatabaseIsA503: with every connection to PostgreSQL broken and new ones refused, login,
// PIX and statement answer 503 ledger_unavailable with Retry-After, never a 500, and everything
// works again once it is back.
func TestALostDatabaseIsA503(t *testing.T) {
	t.Parallel()
	gate := pgtest.NewGate(t, pgtest.URL(t))
	a := startAPI(t, redistest.Start(t), map[string]string{"DATABASE_URL": gate.URL, "DEMO_ACCOUNTS": "true", "DB_TIMEOUT": "500ms"})
	ana := a.Token(demo[0].Document, demo[0].Password)
	gate.Cut()
	for name, send := range map[string]func() apitest.Response{
		"login":     func() apitest.Response { return a.Login(demo[1].Document, demo[1].Password) },
		"PIX":       func() apitest.Response { return a.PIX(ana, "bruno@example.com", 700) },
		"statement": func() apitest.Response { return a.Statement(ana) },
	} {
		if r := send(); r.Status != http.StatusServiceUnavailable || r.JSON(t)["error"] != "ledger_unavailable" || r.Header.Get("Retry-After") == "" {
			t.Errorf("%s with the database gone: %v, want 503 ledger_unavailable with Retry-After", name, r)
		}
	}
	gate.Open()
	// The first calls after the return may still miss the 500 ms on a loaded machine (a stress
	// run's did), and say so; a client retries them.
	if r := apitest.UntilAnswered(t, func() apitest.Response { return a.Statement(ana) }); r.Status != http.StatusOK {
		t.Errorf("statement once the database is back: %v, want 200", r)
	}
}

// TestACommitWithoutAnAnswerIsNeverNothingChanged: a gate holds the PIX's COMMIT past its wait,
// as a slow COMMIT (a synchronous standby that does not answer) would. The answer is 503
// transfer_outcome_unknown with Retry-After, never ledger_unavailable ("nothing was changed").
// Then the COMMIT reaches the server and commits, after its client gave up, and the retry with
// the same Idempotency-Key gets that transfer's receipt; or it never does, and the retry makes
// the transfer. Either way the money moves once.
func TestACommitWithoutAnAnswerIsNeverNothingChanged(t *testing.T) {
	t.Parallel()
	gate := pgtest.NewGate(t, pgtest.URL(t))
	// A DB_TIMEOUT of 1s: at 300ms a busy machine's statements before the COMMIT missed it (503
	// ledger_unavailable, the gate never reached), which is not what this test is about.
	a := startAPI(t, redistest.Start(t), map[string]string{"DATABASE_URL": gate.URL, "DEMO_ACCOUNTS": "true", "DB_TIMEOUT": "1s"})
	ana := a.Token(demo[0].Document, demo[0].Password)
	meter := stalls.Watch(t)
	for _, tt := range []struct {
		name    string
		outcome func()
	}{
		{"committed after its client gave up", gate.ReleaseCommits},
		{"never committed", gate.DropCommits},
	} {
		before := a.Balance(ana)
		key := apitest.NewIdempotencyKey()
		gate.HoldCommits()
		r := a.PIX(ana, "bruno@example.com", 700, "Idempotency-Key", key)
		if body := r.JSON(t); r.Status != http.StatusServiceUnavailable || body["error"] != "transfer_outcome_unknown" ||
			r.Header.Get("Retry-After") != "1" || !strings.Contains(body["message"].(string), "may have been made") {
			t.Errorf("%s: the PIX whose COMMIT went unanswered: %v Retry-After %q, want 503 transfer_outcome_unknown, "+
				"Retry-After 1, saying it may have been made", tt.name, r, r.Header.Get("Retry-After"))
		}
		if took := meter.Just(r.Took); took > 4*time.Second { // the longest transfer, 3s, the machine's own stalls aside
			t.Errorf("%s: the answer took %v with DB_TIMEOUT 1s", tt.name, took)
		}
		if n := gate.Held(); n < 1 { // its own; a loaded run once held another transaction's too
			t.Fatalf("%s: %d COMMITs held at the gate, want the PIX's", tt.name, n)
		}
		tt.outcome()

		send := func() apitest.Response { return a.PIX(ana, "bruno@example.com", 700, "Idempotency-Key", key) }
		retry, again := apitest.UntilAnswered(t, send), apitest.UntilAnswered(t, send)
		if retry.Status != http.StatusCreated || string(again.Body) != string(retry.Body) {
			t.Fatalf("%s: the retries with the same key: %v, then %v; want one 201, twice", tt.name, retry, again)
		}
		if got := a.Balance(ana); got != before-700 {
			t.Errorf("%s: balance %d, want %d: the money moves once", tt.name, got, before-700)
		}
		id, found := retry.JSON(t)["end_to_end_id"], 0
		for _, e := range a.Statement(ana).JSON(t)["entries"].([]any) {
			if e.(map[string]any)["end_to_end_id"] == id {
				found++
			}
		}
		if found != 1 {
			t.Errorf("%s: the receipt's transfer %v is %d times in the statement, want once", tt.name, id, found)
		}
	}
}

// TestAPostgresRestartUnderLoadIsNeverA500: two replicas send PIX, each transfer under its own
// Idempotency-Key and retried with it after a 503 until it gets a definite answer, while the
// test's own PostgreSQL restarts (fast shutdown: sessions terminated, 57P01; then 57P03 while
// it starts), or crashes (immediate shutdown: connections cut mid-answer, COMMITs among them;
// crash recovery at its start). No answer is a 500; every 503 is ledger_unavailable or
// transfer_outcome_unknown, with Retry-After; the ledger holds exactly the transfers answered
// 201, each once; the sum of balances is unchanged.
func TestAPostgresRestartUnderLoadIsNeverA500(t *testing.T) {
	t.Parallel()
	for _, stop := range []struct {
		name string
		do   func(*pgtest.Server)
	}{{"restarted", (*pgtest.Server).Restart}, {"crashed", (*pgtest.Server).Crash}} {
		t.Run(stop.name, func(t *testing.T) {
			t.Parallel()
			underLoad(t, stop.do)
		})
	}
}

// underLoad is TestAPostgresRestartUnderLoadIsNeverA500 with its PostgreSQL stopped and started
// again by outage.
func underLoad(t *testing.T, outage func(*pgtest.Server)) {
	pg := pgtest.StartServer(t)
	srv := redistest.Start(t)
	env := map[string]string{"DATABASE_URL": pg.URL, "DEMO_ACCOUNTS": "true", "DB_TIMEOUT": "1s",
		"PIX_LIMIT": "100000", "PIX_CONCURRENCY": "0", "STATEMENT_LIMIT": "100000", "LOG_LEVEL": "warn"}
	replicas := []*api{startAPI(t, srv, env), startAPI(t, srv, env)}
	tokens := make([]string, len(demo))
	for i, d := range demo {
		tokens[i] = replicas[i%2].Token(d.Document, d.Password)
	}

	var (
		mu       sync.Mutex
		statuses = map[int]int{}
		codes    = map[string]int{}
		created  = map[string]bool{} // end-to-end ids answered 201
		wg       sync.WaitGroup
	)
	stop := make(chan struct{})
	var stopOnce sync.Once
	halt := func() { stopOnce.Do(func() { close(stop) }) }
	defer func() { halt(); wg.Wait() }() // a Fatal below (the restart's) stops the load too: it must not outlive the test
	for r := range replicas {
		for g := range 4 {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(r), uint64(g)))
				for {
					select {
					case <-stop:
						return
					default:
					}
					from := rng.IntN(4)
					to, key, cents := (from+1+rng.IntN(3))%4, apitest.NewIdempotencyKey(), int64(1+rng.IntN(1000))
					for deadline := time.Now().Add(20 * time.Second); ; {
						resp := replicas[r].PIX(tokens[from], demo[to].Key, cents, "Idempotency-Key", key)
						code, _ := resp.JSON(t)["error"].(string)
						mu.Lock()
						statuses[resp.Status]++
						codes[code]++
						if resp.Status == http.StatusCreated {
							created[resp.JSON(t)["end_to_end_id"].(string)] = true
						}
						mu.Unlock()
						if resp.Status == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") == "" {
							t.Errorf("503 without Retry-After: %v", resp)
						}
						if resp.Status != http.StatusServiceUnavailable || time.Now().After(deadline) {
							break
						}
						time.Sleep(50 * time.Millisecond)
					}
				}
			})
		}
	}
	created201 := func() int { mu.Lock(); defer mu.Unlock(); return statuses[http.StatusCreated] }
	time.Sleep(500 * time.Millisecond)
	outage(pg)
	// The load stays on until the ledger has taken 20 transfers since the restart and 50 in all,
	// however slow the machine (a race build on a busy CI took 33 in a fixed second); a
	// deadline bounds the wait, and the checks below say what it got.
	since := created201()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if n := created201(); n-since >= 20 && n >= 50 {
			break
		}
	}
	halt()
	wg.Wait()

	t.Logf("statuses %v, codes %v", statuses, codes)
	for s, n := range statuses {
		if s != http.StatusCreated && s != http.StatusServiceUnavailable && s != http.StatusUnprocessableEntity {
			t.Errorf("%d × %d, want only 201, 503 (during the restart) and 422", n, s)
		}
	}
	for code, n := range codes {
		if code != "" && code != "ledger_unavailable" && code != "transfer_outcome_unknown" && code != "insufficient_funds" {
			t.Errorf("%d × %s", n, code)
		}
	}
	if statuses[http.StatusServiceUnavailable] == 0 || statuses[http.StatusCreated] < 50 {
		t.Errorf("statuses %v: want the restart seen (some 503) and at least 50 transfers", statuses)
	}

	rows, _ := pgtest.Connect(t, pg.URL).Query(t.Context(), "SELECT end_to_end_id FROM transfers")
	inLedger, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range inLedger {
		if !created[id] {
			t.Errorf("transfer %s is in the ledger, but no client was answered 201 for it", id)
		}
	}
	if len(inLedger) != len(created) {
		t.Errorf("%d transfers in the ledger, %d answered 201: want the same, each once", len(inLedger), len(created))
	}
	var total int64
	for i, tok := range tokens {
		total += replicas[(i+1)%2].Balance(tok)
	}
	if want := demoOpening(); total != want {
		t.Errorf("sum of balances %d, want %d", total, want)
	}
}

// TestASlowCommitOnARealServer makes COMMIT slow the way the audit did: the test's own server
// waits for a synchronous standby that does not exist. The PIX's COMMIT gets no answer within its
// wait; the server commits it locally when statement_timeout ends the wait, about when the
// client gives up, so the answer is the receipt (the ledger's second look found the transfer) or
// 503 transfer_outcome_unknown; never ledger_unavailable. The retry with the same key is the
// transfer's receipt, and the money moved once.
func TestASlowCommitOnARealServer(t *testing.T) {
	t.Parallel()
	pg := pgtest.StartServer(t)
	a := startAPI(t, redistest.Start(t), map[string]string{"DATABASE_URL": pg.URL, "DEMO_ACCOUNTS": "true", "DB_TIMEOUT": "1s"}) // the statements before the COMMIT fit in it on a busy machine
	ana := a.Token(demo[0].Document, demo[0].Password)
	before := a.Balance(ana)
	conn := pgtest.Connect(t, pg.URL)
	exec := func(sql string) {
		t.Helper()
		for _, q := range []string{sql, "SELECT pg_reload_conf()"} {
			if _, err := conn.Exec(t.Context(), q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
		time.Sleep(100 * time.Millisecond) // every backend reloads before its next command
	}

	exec("ALTER SYSTEM SET synchronous_standby_names = 'nobody'")
	key := apitest.NewIdempotencyKey()
	first := a.PIX(ana, "bruno@example.com", 700, "Idempotency-Key", key)
	code, _ := first.JSON(t)["error"].(string)
	t.Logf("the PIX whose COMMIT waited for a standby: %v after %v", first, first.Took.Round(time.Millisecond))
	if first.Took < 500*time.Millisecond { // a PIX takes milliseconds; one whose COMMIT waited, its wait
		t.Fatalf("the PIX took %v: its COMMIT did not wait (the setting not yet in force?), and the test would check nothing", first.Took)
	}
	if first.Status != http.StatusCreated && code != "transfer_outcome_unknown" {
		t.Errorf("the PIX whose COMMIT waited for a standby: %v, want 201 or 503 transfer_outcome_unknown", first)
	}
	exec("ALTER SYSTEM RESET synchronous_standby_names")

	retry := apitest.UntilAnswered(t, func() apitest.Response { return a.PIX(ana, "bruno@example.com", 700, "Idempotency-Key", key) })
	if retry.Status != http.StatusCreated || first.Status == http.StatusCreated && string(retry.Body) != string(first.Body) {
		t.Fatalf("the retry with the same key: %v, want 201 with the transfer's receipt (first answer %v)", retry, first)
	}
	if got := a.Balance(ana); got != before-700 {
		t.Errorf("balance %d, want %d: the money moves once", got, before-700)
	}
}

// TestAFullDiskMovesNoMoney: the disk of the test's own PostgreSQL fills. A PIX whose ledger
// must grow a file is refused 503 ledger_unavailable with Retry-After, and moves no money; a PIX
// that found room in pages already written may pass before it (201, its money moved). Once the
// disk is freed, the same PIX, retried with its Idempotency-Key, goes through, once.
func TestAFullDiskMovesNoMoney(t *testing.T) {
	t.Parallel()
	pg := pgtest.StartOnSmallDisk(t, 96<<20)
	a := startAPI(t, redistest.Start(t), map[string]string{"DATABASE_URL": pg.URL, "DEMO_ACCOUNTS": "true", "DB_TIMEOUT": "2s",
		"PIX_LIMIT": "100000", "PIX_CONCURRENCY": "0"})
	ana := a.Token(demo[0].Document, demo[0].Password)
	before := a.Balance(ana)
	if r := a.PIX(ana, "bruno@example.com", 1); r.Status != http.StatusCreated {
		t.Fatalf("a PIX before the disk fills: %v, want 201", r)
	}
	pg.FillDisk()
	created := 1
	var refused apitest.Response
	var key string
	for range 500 { // rows fill a table's last page, then it must grow
		key = apitest.NewIdempotencyKey()
		r := a.PIX(ana, "bruno@example.com", 1, "Idempotency-Key", key)
		if r.Status != http.StatusCreated {
			refused = r
			break
		}
		created++
	}
	t.Logf("%d PIX passed before one found no room", created-1)
	if refused.Status == 0 {
		t.Fatal("500 PIX on a full disk all went through: the disk never refused a write, and the test checks nothing")
	}
	if refused.Status != http.StatusServiceUnavailable || refused.JSON(t)["error"] != "ledger_unavailable" || refused.Header.Get("Retry-After") == "" {
		t.Errorf("the PIX the full disk refused: %v %v, want 503 ledger_unavailable with Retry-After", refused, refused.Header)
	}
	if got, want := a.Balance(ana), before-int64(created); got != want {
		t.Errorf("balance on the full disk %d, want %d: exactly the PIX answered 201 moved money", got, want)
	}
	if logs := a.logs.String(); !strings.Contains(logs, "No space left on device") {
		t.Errorf("the refusal's cause, the full disk, is not logged:\n%s", logs)
	}

	pg.FreeDisk()
	retry := apitest.UntilAnswered(t, func() apitest.Response { return a.PIX(ana, "bruno@example.com", 1, "Idempotency-Key", key) })
	if retry.Status != http.StatusCreated {
		t.Errorf("the refused PIX again, the disk freed: %v, want 201", retry)
	}
	if got, want := a.Balance(ana), before-int64(created)-1; got != want {
		t.Errorf("balance once the disk is freed %d, want %d: the retried PIX moved its money once", got, want)
	}
}

// TestReadsGiveWayToPayments: Ana's and Carla's PIX, two each (LEDGER_ACCOUNT_SHARE: no one
// account may hold more), hold every connection of the replica's pool of four (the first's
// COMMIT held at the gate, the others behind the rows it locked). Meanwhile Diego's statement is
// answered at once 503 ledger_busy with Retry-After 1, and spends no quota; once the COMMIT is
// let through, every PIX is 201: the payments kept the database. DB_TIMEOUT is the longest the
// configuration accepts with the tests' REDIS_TIMEOUT of 1s (5.5 s): a PIX behind the held row
// waits that long for its statement, and beside four CPU burners 5 s was once not enough.
func TestReadsGiveWayToPayments(t *testing.T) {
	t.Parallel()
	gate := pgtest.NewGate(t, pgtest.URL(t))
	a := startAPI(t, redistest.Start(t), map[string]string{"DATABASE_URL": gate.URL + "&pool_max_conns=4", "DEMO_ACCOUNTS": "true",
		"DB_TIMEOUT": "5500ms", "PIX_LIMIT": "100", "STATEMENT_LIMIT": "100", "PIX_CONCURRENCY": "0"})
	ana, carla, diego := a.Token(demo[0].Document, demo[0].Password), a.Token(demo[2].Document, demo[2].Password), a.Token(demo[3].Document, demo[3].Password)
	meter := stalls.Watch(t)
	gate.HoldCommits()
	released := false
	defer func() {
		if !released {
			gate.ReleaseCommits()
		}
	}()
	pix := make(chan apitest.Response, 4)
	for _, payer := range []string{ana, ana, carla, carla} {
		go func() { pix <- a.PIX(payer, "bruno@example.com", 100) }()
	}
	for deadline := time.Now().Add(10 * time.Second); gate.Held() < 1 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
	} // the first PIX holds its COMMIT, and Bruno's row: the three after it fill the pool at once
	served := 0 // statements decided before the pool filled (answered, or timed out waiting): each spent a unit of quota
	var shed apitest.Response
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); served++ {
		if r := a.Statement(diego); r.Status == http.StatusServiceUnavailable && r.JSON(t)["error"] == "ledger_busy" {
			shed = r
			break
		}
	}
	if shed.Status != http.StatusServiceUnavailable || shed.JSON(t)["error"] != "ledger_busy" || shed.Header.Get("Retry-After") != "1" {
		t.Fatalf("a statement while the PIX hold the pool: %v Retry-After %q, want 503 ledger_busy, Retry-After 1 (%d served first)",
			shed, shed.Header.Get("Retry-After"), served)
	}
	if took := meter.Just(shed.Took); took > time.Second {
		t.Errorf("the shed statement took %v: it should not wait for a connection", took)
	}
	gate.ReleaseCommits()
	released = true
	for range 4 {
		if r := <-pix; r.Status != http.StatusCreated {
			t.Errorf("a PIX while statements were shed: %v, want 201", r)
		}
	}
	r := apitest.UntilAnswered(t, func() apitest.Response { return a.Statement(diego) })
	if got, want := r.Header.Get("RateLimit-Remaining"), fmt.Sprint(100-served-1); r.Status != http.StatusOK || got != want {
		t.Errorf("the statement after: %v, RateLimit-Remaining %s, want %s: the shed one spent nothing", r, got, want)
	}
}
