package main

import (
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pixlimit/pixlimit/internal/ratelimit"
	"github.com/pixlimit/pixlimit/internal/testing/apitest"
	"github.com/pixlimit/pixlimit/internal/testing/redistest"
	"github.com/pixlimit/pixlimit/internal/testing/stalls"
)

func TestRedisOutage(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	// A budget longer than the slack below: an answer that waited for two calls (a PIX's admission
	// and a release after it) is late by a whole budget, more than a loaded runner's slack.
	const budget = 250 * time.Millisecond
	a := startAPI(t, srv, map[string]string{"REDIS_TIMEOUT": budget.String(), "FAIL_CLOSED_RETRY_AFTER": "3s"})
	ana := a.Token(demo[0].Document, demo[0].Password)
	before := a.Balance(ana)
	meter := stalls.Watch(t) // a loaded runner's stalls are not the budget's

	for _, outage := range []struct {
		name     string
		down, up func()
	}{{"killed", srv.Kill, srv.Restart}, {"paused", srv.Pause, srv.Resume}} {
		outage.down()
		within := func(what string, r apitest.Response) {
			t.Helper()
			// The limiter waits at most the budget; the rest is HTTP on loopback.
			if took := meter.Just(r.Took); took > budget+150*time.Millisecond {
				t.Errorf("%s, %s: answered in %v (%v without the machine's stalls), want within the %v budget", outage.name, what, r.Took, took, budget)
			}
		}

		// Login fails closed before the password is looked at: the right password is refused.
		r := a.Login(demo[0].Document, demo[0].Password)
		within("login", r)
		if r.Status != http.StatusTooManyRequests || r.JSON(t)["error"] != "rate_limiter_unavailable" || r.Header.Get("Retry-After") != "3" {
			t.Errorf("%s, login: %v %v, want 429 rate_limiter_unavailable with Retry-After 3", outage.name, r, r.Header)
		}
		r = a.PIX(ana, "bruno@example.com", 100)
		within("PIX", r)
		if r.Status != http.StatusTooManyRequests || r.JSON(t)["error"] != "rate_limiter_unavailable" {
			t.Errorf("%s, PIX: %v, want 429 rate_limiter_unavailable", outage.name, r)
		}
		// The key look-up (its DICT buckets fail closed, no variable changes that) and the settings
		// routes (SETTINGS_FAIL_MODE, closed by default) refuse as the login does: README's table.
		for _, path := range []string{"/v1/pix/keys/bruno@example.com", "/v1/limits"} {
			r = a.Do(http.MethodGet, path, nil, "Authorization", "Bearer "+ana)
			within(path, r)
			if r.Status != http.StatusTooManyRequests || r.JSON(t)["error"] != "rate_limiter_unavailable" {
				t.Errorf("%s, %s: %v, want 429 rate_limiter_unavailable", outage.name, path, r)
			}
		}
		// The statement decides in its fallback (its default fail mode), at its share: a replica alone
		// assumes the floor, RATELIMIT_FLEET_SIZE (2), and says so in its headers.
		r = a.Statement(ana)
		within("statement", r)
		if r.Status != http.StatusOK || r.Header.Get("RateLimit-Policy") != `"statement";q=15;w=60` {
			t.Errorf("%s, statement: %v %v, want 200 decided by the fallback, RateLimit-Policy of the local quota (15 of 30)", outage.name, r, r.Header)
		}
		if got := int64(r.JSON(t)["balance_cents"].(float64)); got != before {
			t.Errorf("%s: balance %d, want %d: a refused PIX moved money", outage.name, got, before)
		}
		r = a.Do(http.MethodGet, "/readyz", nil)
		if r.Status != http.StatusServiceUnavailable || r.JSON(t)["redis"] != "down" {
			t.Errorf("%s, readyz: %v, want 503 redis down", outage.name, r)
		}

		outage.up()
		back := time.Now()
		// Until a replica can decide again (its readiness asks what a decision needs): a request
		// sent in the instant Redis returns may still meet the pool's last dial error.
		for a.Do(http.MethodGet, "/readyz", nil).Status != http.StatusOK && time.Since(back) < 3*time.Second {
			time.Sleep(20 * time.Millisecond)
		}
		if r := a.PIX(ana, "bruno@example.com", 100); r.Status != http.StatusCreated || r.Header.Get("RateLimit-Remaining") == "" {
			t.Fatalf("%s, Redis back: PIX %v %v, want 201 with RateLimit headers", outage.name, r, r.Header)
		}
		before -= 100
		if r := a.Login(demo[1].Document, demo[1].Password); r.Status != http.StatusOK {
			t.Fatalf("%s, Redis back: login %v, want 200", outage.name, r)
		}
		if r := a.Do(http.MethodGet, "/readyz", nil); r.Status != http.StatusOK {
			t.Fatalf("%s, Redis back: readyz %v", outage.name, r)
		}
		t.Logf("%s: limiting resumed %v after Redis came back", outage.name, time.Since(back).Round(time.Millisecond))
	}
	// The outage log (package outages) says the outage and its cause; each route the fail mode it applied.
	if logs := a.logs.String(); !strings.Contains(logs, `msg="rate limiter unavailable" policy=login-ip cause=`) ||
		!strings.Contains(logs, "policy=login-ip fail_mode=closed") || !strings.Contains(logs, "policy=statement fail_mode=local") {
		t.Errorf("outages not logged per policy and fail mode:\n%s", logs)
	}
}

// TestReadinessMeansDecisionsWork: a Redis that answers PING but refuses writes (made a replica,
// so read-only; out of memory under noeviction) fails every decision, so the replica is not
// ready, and says so; an open breaker is named. Ready again once Redis takes writes, no restart.
func TestReadinessMeansDecisionsWork(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	a := startAPI(t, srv, map[string]string{"REDIS_TIMEOUT": "500ms", "RATELIMIT_BREAKER_FAILURES": "0"})
	admin := srv.Client(nil)
	ctx := t.Context()
	ready := func(want int, what string) map[string]any {
		t.Helper()
		r := a.Do(http.MethodGet, "/readyz", nil)
		if r.Status != want {
			t.Errorf("%s: /readyz %v, want %d", what, r, want)
		}
		return r.JSON(t)
	}
	ready(http.StatusOK, "Redis taking writes")
	nowhere := apitest.FreeAddr(t)
	host, port, _ := strings.Cut(nowhere, ":")
	for _, fault := range []struct {
		name     string
		do, undo [][]any
	}{
		{"a read-only replica", [][]any{{"REPLICAOF", host, port}}, [][]any{{"REPLICAOF", "NO", "ONE"}}},
		{"out of memory, noeviction", [][]any{{"CONFIG", "SET", "maxmemory-policy", "noeviction"}, {"CONFIG", "SET", "maxmemory", "1"}},
			[][]any{{"CONFIG", "SET", "maxmemory", "0"}}},
	} {
		for _, cmd := range fault.do {
			if err := admin.Do(ctx, cmd...).Err(); err != nil {
				t.Fatalf("%v: %v", cmd, err)
			}
		}
		if err := admin.Ping(ctx).Err(); err != nil {
			t.Fatalf("%s: PING %v, want PONG: the fault is one PING does not see", fault.name, err)
		}
		if body := ready(http.StatusServiceUnavailable, fault.name); body["redis"] != "down" {
			t.Errorf("%s: /readyz %v, want redis down", fault.name, body)
		}
		if r := a.Login(demo[0].Document, demo[0].Password); r.Status != http.StatusTooManyRequests || r.JSON(t)["error"] != "rate_limiter_unavailable" {
			t.Errorf("%s: login %v, want 429 rate_limiter_unavailable (the replica is rightly not ready)", fault.name, r)
		}
		for _, cmd := range fault.undo {
			if err := admin.Do(ctx, cmd...).Err(); err != nil {
				t.Fatalf("%v: %v", cmd, err)
			}
		}
		ready(http.StatusOK, fault.name+", undone")
	}

	// The breaker opened while Redis was stalled (a cool-down of a minute): /readyz names it while
	// Redis still stalls, and, Redis back, readiness's own probe closes it, so the replica is
	// ready (and decides) at once rather than a minute later.
	b := startAPI(t, srv, map[string]string{"REDIS_TIMEOUT": "100ms", "RATELIMIT_BREAKER_FAILURES": "2", "RATELIMIT_BREAKER_COOLDOWN": "1m"})
	srv.Pause()
	for range 2 {
		b.Login(demo[1].Document, demo[1].Password)
	}
	if r := b.Do(http.MethodGet, "/readyz", nil); r.Status != http.StatusServiceUnavailable || r.JSON(t)["breaker"] != "open" {
		t.Errorf("with the breaker open and Redis stalled: /readyz %v, want 503 naming the breaker open", r)
	}
	srv.Resume()
	if r := b.Do(http.MethodGet, "/readyz", nil); r.Status != http.StatusOK {
		t.Errorf("Redis back, the breaker's cool-down not over: /readyz %v, want 200 (its probe closes the breaker)", r)
	}
	if r := b.Login(demo[1].Document, demo[1].Password); r.Status != http.StatusOK {
		t.Errorf("then a login: %v, want 200, decided by Redis", r)
	}
}

// TestTheStatementDecidesLocallyWhileRedisIsGone: three replicas, STATEMENT_LIMIT 10, Redis
// killed. Each replica decides in memory at its share, ⌈10 / 3⌉ = 4 per window for one account
// (the heartbeat counted three), with the same headers and refusals as Redis's; the fleet admits
// 12, not unlimited. Once Redis is back, the next decision is Redis's again (breaker off here:
// with it, within one cool-down).
func TestTheStatementDecidesLocallyWhileRedisIsGone(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	env := map[string]string{"STATEMENT_LIMIT": "10", "REDIS_TIMEOUT": "200ms", "RATELIMIT_BREAKER_FAILURES": "0"}
	replicas := []*api{startAPI(t, srv, env), startAPI(t, srv, env), startAPI(t, srv, env)}
	ana := replicas[0].Token(demo[0].Document, demo[0].Password)
	everyReplicaCounted(t, srv, len(replicas))
	srv.Kill()
	admitted := 0
	for i, a := range replicas {
		var got []int
		for range 6 {
			r := a.Statement(ana)
			got = append(got, r.Status)
			if r.Status == http.StatusOK {
				admitted++
				if p := r.Header.Get("RateLimit-Policy"); p != `"statement";q=4;w=60` {
					t.Errorf("replica %d: RateLimit-Policy %q, want the local quota, q=4", i+1, p)
				}
			} else if r.Status != http.StatusTooManyRequests || r.JSON(t)["error"] != "rate_limit_exceeded" || r.Header.Get("Retry-After") == "" {
				t.Errorf("replica %d: %v, want 429 rate_limit_exceeded with Retry-After past the local quota", i+1, r)
			}
		}
		if want := []int{200, 200, 200, 200, 429, 429}; !slices.Equal(got, want) {
			t.Errorf("replica %d with Redis gone: %v, want %v", i+1, got, want)
		}
	}
	if admitted != 12 {
		t.Errorf("the fleet admitted %d with Redis gone, want 12 (4 × 3), not unlimited", admitted)
	}
	srv.Restart()
	r := replicas[1].Statement(ana)
	if r.Status != http.StatusOK || r.Header.Get("RateLimit-Policy") != `"statement";q=10;w=60` {
		t.Errorf("the first statement after Redis returned: %v %v, want Redis's decision (q=10)", r, r.Header)
	}
}

// TestANetworkCutKeepsTheCount: the network between a replica and Redis is cut, Redis running on
// and nothing crossing either way, then healed. During the cut each route answers as when Redis is
// gone, within the budget. Healed, the limits go on from what Redis holds (a cut is not a
// restart), and the PIX refused during the cut is not counted, though its admission, sent before
// the replica gave up, reaches Redis late once the network heals.
func TestANetworkCutKeepsTheCount(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	link := srv.Link()
	const budget = 250 * time.Millisecond
	a := startAPI(t, srv, map[string]string{"REDIS_URL": "redis://" + link.Addr(), "REDIS_TIMEOUT": budget.String()})
	ana := a.Token(demo[0].Document, demo[0].Password)
	for i := range 3 {
		if r := a.PIX(ana, "bruno@example.com", 100); r.Status != http.StatusCreated {
			t.Fatalf("PIX %d before the cut: %v, want 201", i+1, r)
		}
	}
	meter := stalls.Watch(t)
	link.Cut()
	r := a.PIX(ana, "bruno@example.com", 100)
	if r.Status != http.StatusTooManyRequests || r.JSON(t)["error"] != "rate_limiter_unavailable" {
		t.Errorf("a PIX, the network cut: %v, want 429 rate_limiter_unavailable", r)
	}
	if took := meter.Just(r.Took); took > budget+150*time.Millisecond {
		t.Errorf("the PIX answered in %v (%v without the machine's stalls), want within the %v budget", r.Took, took, budget)
	}
	if r := a.Statement(ana); r.Status != http.StatusOK || r.Header.Get("RateLimit-Policy") != `"statement";q=15;w=60` {
		t.Errorf("a statement, the network cut: %v %v, want 200 decided by the fallback at its share", r, r.Header)
	}
	if r := a.Do(http.MethodGet, "/readyz", nil); r.Status != http.StatusServiceUnavailable {
		t.Errorf("/readyz, the network cut: %v, want 503", r)
	}

	link.Heal() // what the replica sent during the cut is in Redis's hands when it returns
	healed := time.Now()
	for a.Do(http.MethodGet, "/readyz", nil).Status != http.StatusOK {
		if time.Since(healed) > 3*time.Second {
			t.Fatal("/readyz not 200 within 3 s of the heal")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The refused PIX's admission reached Redis as the network healed: package withdraw takes it
	// back, by the attempts it made during the cut (delivered after it) or by those it goes on
	// making. Ana's PIX log holds her 3 admissions again.
	rdb := srv.Client(nil)
	logs, err := rdb.Keys(t.Context(), ratelimit.DefaultPrefix+":pix:{*}").Result()
	if err != nil || len(logs) != 1 {
		t.Fatalf("Ana's PIX log in Redis: %v %v, want one key", logs, err)
	}
	held := int64(0)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if held, err = rdb.ZCard(t.Context(), logs[0]).Result(); err == nil && held == 3 {
			break
		}
	}
	if held != 3 {
		t.Fatalf("Ana's PIX log holds %d admissions 5 s after the heal, want 3: the refused PIX's late admission stayed", held)
	}
	t.Logf("the late admission taken back by a live attempt: %v", strings.Contains(a.logs.String(), "rate limiter withdrew a late decision"))
	var got []int
	for range 8 {
		got = append(got, a.PIX(ana, "bruno@example.com", 100).Status)
	}
	if want := []int{201, 201, 201, 201, 201, 201, 201, 429}; !slices.Equal(got, want) {
		t.Errorf("PIX once healed: %v, want %v: 3 counted before the cut, the refused one not", got, want)
	}
}

// TestAnOpenPIXWaitsForRedisOnce: with PIX_FAIL_MODE=open, a PIX whose admission Redis did not
// answer goes through, answered within the Redis timeout: its settlement (the look-up's refund,
// its slot given back) is sent on its way, not waited for, where it waited a second budget. A
// PIX to a key nobody has is answered at once as the look-up's buckets answer without Redis
// (closed: 429), not after its miss's charge waited too.
func TestAnOpenPIXWaitsForRedisOnce(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	const budget = 250 * time.Millisecond
	a := startAPI(t, srv, map[string]string{"REDIS_TIMEOUT": budget.String(), "PIX_FAIL_MODE": "open"})
	ana := a.Token(demo[0].Document, demo[0].Password)
	before := a.Balance(ana)
	meter := stalls.Watch(t)
	srv.Pause()
	r := a.PIX(ana, "bruno@example.com", 100)
	if r.Status != http.StatusCreated || r.Header.Get("RateLimit-Limit") != "" || r.Header.Get("RateLimit-Policy") != "" {
		t.Errorf("a PIX with Redis paused, failing open: %v %v, want 201 without RateLimit headers (no limit decided it)", r, r.Header)
	}
	if took := meter.Just(r.Took); took > budget+150*time.Millisecond {
		t.Errorf("the PIX answered in %v (%v without the machine's stalls), want within the %v budget", r.Took, took, budget)
	}
	r = a.PIX(ana, "nobody@example.com", 100)
	if r.Status != http.StatusTooManyRequests || r.JSON(t)["error"] != "rate_limiter_unavailable" {
		t.Errorf("a PIX to a key nobody has, Redis paused: %v, want 429 rate_limiter_unavailable", r)
	}
	if took := meter.Just(r.Took); took > budget+150*time.Millisecond {
		t.Errorf("the miss answered in %v (%v without the machine's stalls), want within the %v budget", r.Took, took, budget)
	}
	srv.Resume()
	if got, want := a.Balance(ana), before-100; got != want {
		t.Errorf("balance %d, want %d: the admitted PIX alone moved money", got, want)
	}
}

// everyReplicaCounted waits until each of n replicas has counted a fleet of n (the outage
// fallback's share): the fleet's roster in srv holds n, and each has beaten since it did.
func everyReplicaCounted(t *testing.T, srv *redistest.Server, n int) {
	t.Helper()
	rdb := srv.Client(nil)
	defer rdb.Close()
	roster := ratelimit.DefaultPrefix + ":{fleet}"
	var all int64 // the Redis time, ms, at which the roster was seen holding n
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		beats, err := rdb.ZRangeWithScores(t.Context(), roster, 0, -1).Result()
		if err != nil || len(beats) != n {
			continue
		}
		if all == 0 {
			now, err := rdb.Time(t.Context()).Result()
			if err != nil {
				continue
			}
			all = now.UnixMilli()
		}
		if !slices.ContainsFunc(beats, func(z redis.Z) bool { return int64(z.Score) <= all }) {
			return
		}
	}
	t.Fatalf("the replicas did not each count a fleet of %d within 15s", n)
}
