package pixlimit_test

import (
	"context"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pixlimit/pixlimit/internal/pix"
	"github.com/pixlimit/pixlimit/internal/testing/apitest"
	"github.com/pixlimit/pixlimit/internal/testing/redistest"
)

// TestTheQueuePacesPIXAcrossTheFleet: a payroll of 12 PIX at once over three replicas, on a
// leaky_bucket PIX route of 2 per second (a pace of 500 ms: HTTP answers on a busy machine move by
// tens of milliseconds) with a queue of 4: exactly 5 are
// served (one at once, four at their turns), at the pace within 10% on average (each answer goes
// through HTTP, whose own times move by milliseconds on a busy machine, so no two answers closer
// than half the pace this run measured), each saying how long it waited; the other 7 are
// refused at once.
func TestTheQueuePacesPIXAcrossTheFleet(t *testing.T) {
	t.Parallel()
	ledger, err := pix.NewMemoryLedger(apitest.DemoAccounts(t))
	if err != nil {
		t.Fatal(err)
	}
	srv := redistest.Start(t)
	replicas, _ := fleet(t, srv, ledger, 3, map[string]string{"REDIS_TIMEOUT": "1s",
		"PIX_ALGORITHM": "leaky_bucket", "PIX_LIMIT": "2", "PIX_WINDOW": "1s", "PIX_QUEUE": "4"})
	ana := replicas[0].Token(apitest.Demo[0].Document, apitest.Demo[0].Password)
	replicas[1].Statement(ana) // every replica's connections and scripts warm
	replicas[2].Statement(ana)
	type answer struct {
		status int
		at     time.Duration
		h      http.Header
	}
	var mu sync.Mutex
	var got []answer
	// The turns Redis gives, watched while they are given: the queue's sorted set (member a
	// request, score its turn in µs) keeps a turn until a pace after it, and the key goes a pace
	// after the last, which a busy machine may reach before the last answer is read.
	rdb := srv.Client(nil)
	turns := map[string]float64{}
	watching, watched := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watched)
		for {
			for _, k := range rdb.Keys(t.Context(), "rl:pix:leaky_bucket:*").Val() {
				for _, z := range rdb.ZRangeWithScores(t.Context(), k, 0, -1).Val() {
					turns[k+" "+z.Member.(string)] = z.Score
				}
			}
			select {
			case <-watching:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	start := time.Now()
	var wg sync.WaitGroup
	for i := range 12 {
		wg.Go(func() {
			r := replicas[i%3].PIX(ana, "bruno@example.com", 100)
			mu.Lock()
			got = append(got, answer{r.Status, time.Since(start), r.Header})
			mu.Unlock()
		})
	}
	wg.Wait()
	close(watching)
	<-watched
	slices.SortFunc(got, func(a, b answer) int { return int(a.at - b.at) })
	var served, refused []answer
	for _, a := range got {
		switch a.status {
		case http.StatusCreated:
			served = append(served, a)
		case http.StatusTooManyRequests:
			refused = append(refused, a)
		default:
			t.Fatalf("a PIX answered %d", a.status)
		}
	}
	if len(served) != 5 || len(refused) != 7 {
		t.Fatalf("12 PIX at once: %d served, %d refused; want exactly 5 (a queue of 4 and one at once) and 7", len(served), len(refused))
	}
	for _, a := range refused {
		if a.at > served[1].at-served[1].at/4 {
			t.Errorf("a refusal came at %v, the first turn at %v: refusals are at once", a.at, served[1].at)
		}
		if a.h.Get("Retry-After") == "" {
			t.Error("a queue's refusal without Retry-After")
		}
	}
	// The pace is judged by what the queue decided, the turns Redis gave, not by when the answers
	// reached this client, which a busy machine's scheduler delays (a 446 ms "pace" was once
	// measured so): five turns, in one key, each a pace after the one before.
	keys := map[string]bool{}
	var scores []float64
	for member, score := range turns {
		key, _, _ := strings.Cut(member, " ")
		keys[key] = true
		scores = append(scores, score)
	}
	slices.Sort(scores)
	if len(keys) != 1 || len(scores) != 5 {
		t.Fatalf("the PIX queue gave %d turns in %d keys, want 5 in one", len(scores), len(keys))
	}
	for i := 1; i < len(scores); i++ {
		if gap := time.Duration(scores[i]-scores[i-1]) * time.Microsecond; gap != 500*time.Millisecond {
			t.Errorf("turn %d came %v after the one before, want the pace 500ms exactly", i, gap)
		}
	}
	if st := served[0].h.Get("Server-Timing"); st != "throttle;dur=0" {
		t.Errorf("the PIX whose turn was at once answered Server-Timing %q, want throttle;dur=0", st)
	}
	for i := 1; i < 5; i++ {
		if st := served[i].h.Get("Server-Timing"); !strings.HasPrefix(st, "throttle;dur=") {
			t.Errorf("a PIX that waited its turn answered Server-Timing %q", st)
		}
	}
	if p := served[0].h.Get("RateLimit-Policy"); !strings.Contains(p, `"pix";q=2;w=1;pixlimit-queue=4`) {
		t.Errorf("RateLimit-Policy %q, want the queue's places", p)
	}
}

// gated is a ledger whose transfers wait at a gate: PIX in progress, for as long as a test wants.
type gated struct {
	pix.Ledger
	entered chan struct{}
	gate    chan struct{}
	once    sync.Once
}

// newGated is inner behind a closed gate. A test opens it when it ends, if not before, by
// t.Cleanup(g.open) after its servers' cleanups (cleanups run last first): a test that fails with
// PIX at the gate must not wait for them in its servers' Close.
func newGated(inner pix.Ledger, buffered int) *gated {
	return &gated{Ledger: inner, entered: make(chan struct{}, buffered), gate: make(chan struct{})}
}

// open opens the gate: the PIX held there go on, and the later ones pass.
func (g *gated) open() { g.once.Do(func() { close(g.gate) }) }

// arrived waits for one more PIX to reach the ledger (what: which), at most 30 s.
func (g *gated) arrived(t *testing.T, what string) {
	t.Helper()
	select {
	case <-g.entered:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: no PIX reached the ledger within 30s", what)
	}
}

func (g *gated) Transfer(ctx context.Context, r pix.TransferRequest) (pix.Receipt, error) {
	select {
	case g.entered <- struct{}{}:
	case <-ctx.Done():
		return pix.Receipt{}, ctx.Err()
	}
	select {
	case <-g.gate:
	case <-ctx.Done(): // the client gave up: the test has failed
		return pix.Receipt{}, ctx.Err()
	}
	return g.Ledger.Transfer(ctx, r)
}

// gatedFleet starts n replicas over a memory ledger behind a closed gate (newGated, buffered),
// configured by env, and returns the gate, the replicas and Ana's access token. The gate opens
// when the test ends, if not before, after the servers' cleanups.
func gatedFleet(t *testing.T, n, buffered int, env map[string]string) (*gated, []*apitest.Client, string) {
	t.Helper()
	inner, err := pix.NewMemoryLedger(apitest.DemoAccounts(t))
	if err != nil {
		t.Fatal(err)
	}
	ledger := newGated(inner, buffered)
	replicas, _ := fleet(t, redistest.Start(t), ledger, n, env)
	t.Cleanup(ledger.open) // before the servers close: a PIX held at the gate goes on
	return ledger, replicas, replicas[0].Token(apitest.Demo[0].Document, apitest.Demo[0].Password)
}

// TestAnAccountHasTwoPIXInProgress: with two PIX of Ana in progress (on one replica), a third is
// refused at once, 429 with Retry-After 1 and the draft's concurrent-requests quota, on another
// replica and on theirs, where the two hold every place of Ana's of its ledger
// (LEDGER_ACCOUNT_SHARE, 2): it does not wait for one; a replay of one in progress is not
// refused, and gets its original's answer. (A replica killed holding
// slots: cmd/api's TestAKilledReplicasSlotsFreeAtTheirLease.)
func TestAnAccountHasTwoPIXInProgress(t *testing.T) {
	t.Parallel()
	inner, err := pix.NewMemoryLedger(apitest.DemoAccounts(t))
	if err != nil {
		t.Fatal(err)
	}
	ledger := newGated(inner, 16)
	replicas, _ := fleet(t, redistest.Start(t), ledger, 3, map[string]string{"REDIS_TIMEOUT": "1s",
		"DB_TIMEOUT": "100ms"})
	t.Cleanup(ledger.open) // before the servers close: a PIX held at the gate goes on
	ana := replicas[0].Token(apitest.Demo[0].Document, apitest.Demo[0].Password)
	keys := []string{apitest.NewIdempotencyKey(), apitest.NewIdempotencyKey()}
	var wg sync.WaitGroup
	var first [2]apitest.Response
	for i, key := range keys {
		wg.Go(func() { first[i] = replicas[0].PIX(ana, "bruno@example.com", 100, "Idempotency-Key", key) })
		ledger.arrived(t, "a PIX in progress")
	}
	for _, r := range []int{2, 0} {
		third := replicas[r].PIX(ana, "bruno@example.com", 100)
		if third.Status != http.StatusTooManyRequests || third.Header.Get("Retry-After") != "1" ||
			!strings.Contains(third.Header.Get("RateLimit-Policy"), `"pix-concurrency";q=2;qu="concurrent-requests"`) {
			t.Fatalf("a third PIX with two in progress, on replica %d: %d, Retry-After %q, RateLimit-Policy %q; want 429, 1, the concurrent-requests quota",
				r, third.Status, third.Header.Get("Retry-After"), third.Header.Get("RateLimit-Policy"))
		}
	}
	var replay apitest.Response
	wg.Go(func() { replay = replicas[2].PIX(ana, "bruno@example.com", 100, "Idempotency-Key", keys[0]) })
	ledger.arrived(t, "the replay") // it reached the ledger: not refused
	ledger.open()
	wg.Wait()
	if first[0].Status != http.StatusCreated || first[1].Status != http.StatusCreated || replay.Status != http.StatusCreated {
		t.Fatalf("the two PIX and the replay: %d, %d, %d; want 201 each", first[0].Status, first[1].Status, replay.Status)
	}
	if a, b := first[0].JSON(t)["end_to_end_id"], replay.JSON(t)["end_to_end_id"]; a != b {
		t.Errorf("the replay answered %v, its original %v: want the original's answer", b, a)
	}
	if r := replicas[1].PIX(ana, "bruno@example.com", 100); r.Status != http.StatusCreated {
		t.Errorf("after both ended, a PIX answered %d: their slots were not given back", r.Status)
	}
}

// TestASlotOutlivesNoStall: an in-flight slot that Redis holds but whose release it did not
// answer is given back once Redis answers again, so the account's next PIX is admitted within
// seconds, not at the end of the slot's lease (10 minutes here): with one slot, a customer paying
// one PIX at a time would be refused pix-concurrency for the rest of it. The breaker opens at the
// first failure, so a release Redis cannot answer is never sent: twice, a slot taken and its
// release lost, once in the settlement (Redis frozen while the PIX is in the ledger) and once in
// the admission (its script waits in the frozen Redis and runs when it thaws).
func TestASlotOutlivesNoStall(t *testing.T) {
	t.Parallel()
	inner, err := pix.NewMemoryLedger(apitest.DemoAccounts(t))
	if err != nil {
		t.Fatal(err)
	}
	ledger, srv := newGated(inner, 64), redistest.Start(t) // room for every PIX to pass
	replicas, _ := fleet(t, srv, ledger, 1, map[string]string{"REDIS_TIMEOUT": "300ms", "RATELIMIT_BREAKER_FAILURES": "1",
		"PIX_CONCURRENCY": "1", "CONCURRENCY_LEASE": "10m"})
	t.Cleanup(ledger.open)
	ana := replicas[0].Token(apitest.Demo[0].Document, apitest.Demo[0].Password)
	bruno := replicas[0].Token(apitest.Demo[1].Document, apitest.Demo[1].Password)
	next := func(what string) {
		t.Helper()
		var refused []int
		for deadline := time.Now().Add(20 * time.Second); ; {
			r := replicas[0].PIX(ana, "bruno@example.com", 100)
			if r.Status == http.StatusCreated {
				return
			}
			refused = append(refused, r.Status)
			if time.Now().After(deadline) {
				t.Fatalf("%s: 20s after Redis returned, Ana's next PIX is still refused (%v; the last %v): her slot was not given back", what, refused, r)
			}
			time.Sleep(50 * time.Millisecond) // polling the replica's retry, not timing it
		}
	}

	var first apitest.Response
	var wg sync.WaitGroup
	wg.Go(func() { first = replicas[0].PIX(ana, "bruno@example.com", 100) })
	ledger.arrived(t, "the PIX")
	srv.Pause()
	replicas[0].Statement(bruno) // fails: the breaker opens
	ledger.open()
	wg.Wait()
	srv.Resume()
	if first.Status != http.StatusCreated {
		t.Fatalf("the PIX whose settlement Redis did not answer: %d, want 201 (the ledger moved it)", first.Status)
	}
	next("a settlement lost")

	srv.Pause()
	lost := replicas[0].PIX(ana, "bruno@example.com", 100)
	srv.Resume()
	if lost.Status != http.StatusTooManyRequests || lost.JSON(t)["error"] != "rate_limiter_unavailable" {
		t.Fatalf("a PIX whose admission Redis did not answer: %v, want 429 rate_limiter_unavailable", lost)
	}
	next("an admission lost")
}

// TestAReplicaHoldsAtMostThrottleMaxWaiting: with THROTTLE_MAX_WAITING=1, of 4 statements at once
// on a queue with room for more, one is served at once, one waits its turn, and the other two
// are refused at once: 429 with Retry-After and no place left, as any refusal.
func TestAReplicaHoldsAtMostThrottleMaxWaiting(t *testing.T) {
	t.Parallel()
	ledger, err := pix.NewMemoryLedger(apitest.DemoAccounts(t))
	if err != nil {
		t.Fatal(err)
	}
	replicas, _ := fleet(t, redistest.Start(t), ledger, 1, map[string]string{"REDIS_TIMEOUT": "1s", "THROTTLE_MAX_WAITING": "1",
		"STATEMENT_ALGORITHM": "leaky_bucket", "STATEMENT_LIMIT": "2", "STATEMENT_WINDOW": "1s"}) // a turn every 500 ms, 8 places
	ana := replicas[0].Token(apitest.Demo[0].Document, apitest.Demo[0].Password)
	var mu sync.Mutex
	var refused []apitest.Response
	got := apitest.Burst(replicas, 4, func(c *apitest.Client, _ int) apitest.Response {
		r := c.Statement(ana)
		if r.Status == http.StatusTooManyRequests {
			mu.Lock()
			refused = append(refused, r)
			mu.Unlock()
		}
		return r
	})
	if got[200] != 2 || got[429] != 2 {
		t.Fatalf("4 statements at once, one waiter allowed: %v, want 2 × 200 and 2 × 429", got)
	}
	for _, r := range refused {
		if r.Header.Get("Retry-After") == "" || r.Header.Get("RateLimit-Remaining") != "0" {
			t.Errorf("a refusal past THROTTLE_MAX_WAITING: Retry-After %q, RateLimit-Remaining %q; want a retry and no place",
				r.Header.Get("Retry-After"), r.Header.Get("RateLimit-Remaining"))
		}
	}
}

// TestAKeyInProgressMakesNoOtherLedgerCall: 16 PIX of Ana at once over two replicas, one
// Idempotency-Key and 16 bodies, while the original is held in the ledger: no other reaches the
// ledger until it has answered (on its replica, its turn; on the other, its mark in Redis), and
// each replica lets one of them at a time reach the limiter; then each is answered in turn from
// the ledger's record, 409 for another body. With and without the in-flight limit.
func TestAKeyInProgressMakesNoOtherLedgerCall(t *testing.T) {
	t.Parallel()
	for _, concurrency := range []string{"0", "2"} {
		t.Run("PIX_CONCURRENCY="+concurrency, func(t *testing.T) {
			t.Parallel()
			inner, err := pix.NewMemoryLedger(apitest.DemoAccounts(t))
			if err != nil {
				t.Fatal(err)
			}
			ledger := newGated(inner, 16)
			srv := redistest.Start(t)
			replicas, _ := fleet(t, srv, ledger, 2, map[string]string{"REDIS_TIMEOUT": "1s",
				"PIX_LIMIT": "100", "PIX_CONCURRENCY": concurrency})
			t.Cleanup(ledger.open) // before the servers close: a PIX held at the gate goes on
			ana := replicas[0].Token(apitest.Demo[0].Document, apitest.Demo[0].Password)
			key := apitest.NewIdempotencyKey()
			var mu sync.Mutex
			statuses := map[int]int{}
			var wg sync.WaitGroup
			for i := range 16 {
				wg.Go(func() {
					r := replicas[i%2].PIX(ana, "bruno@example.com", int64(100+i), "Idempotency-Key", key)
					mu.Lock()
					statuses[r.Status]++
					mu.Unlock()
				})
			}
			ledger.arrived(t, "the original") // held at the gate
			// Each replica lets one request of the key at a time go on, the rest waiting their turn
			// with no limiter call: the original, held, and the other replica's first, admitted
			// (Ana's pix log holds it) and waiting for the original's mark. The log holds 2.
			admitted := pixLog(t, srv)
			for deadline := time.Now().Add(5 * time.Second); admitted() < 2 && time.Now().Before(deadline); {
				time.Sleep(10 * time.Millisecond)
			}
			select {
			case <-ledger.entered:
				t.Error("a second PIX of the key reached the ledger while its original was in progress")
			case <-time.After(300 * time.Millisecond): // the replica's own 7 are in by now (a request's parsing)
			}
			if got := admitted(); got != 2 {
				t.Errorf("%d PIX admitted by the limiter while the original was held, want 2: the original and the other replica's first", got)
			}
			ledger.open()
			wg.Wait()
			if statuses[http.StatusCreated] != 1 || statuses[http.StatusConflict] != 15 {
				t.Errorf("16 PIX of one key and 16 bodies: %v, want 1 × 201 and 15 × 409", statuses)
			}
		})
	}
}

// TestALedgerBusyPIXSpendsNothing: with LEDGER_ACCOUNT_SHARE 1, a second PIX of Ana while her
// first is in the ledger finds one of her two in-flight slots free (PIX_CONCURRENCY 2; with none
// free it would be refused at once: TestAnAccountHasTwoPIXInProgress), waits its turn
// (DB_TIMEOUT), then is 503 ledger_busy with Retry-After 1, having been admitted by nothing and
// asked the ledger nothing: of PIX_LIMIT 2, the quota it did not spend admits her next PIX.
func TestALedgerBusyPIXSpendsNothing(t *testing.T) {
	t.Parallel()
	inner, err := pix.NewMemoryLedger(apitest.DemoAccounts(t))
	if err != nil {
		t.Fatal(err)
	}
	ledger := newGated(inner, 16)
	replicas, _ := fleet(t, redistest.Start(t), ledger, 1, map[string]string{"REDIS_TIMEOUT": "1s",
		"DB_TIMEOUT": "200ms", "LEDGER_ACCOUNT_SHARE": "1", "PIX_LIMIT": "2", "PIX_CONCURRENCY": "2"})
	t.Cleanup(ledger.open) // before the servers close: a PIX held at the gate goes on
	a := replicas[0]
	ana := a.Token(apitest.Demo[0].Document, apitest.Demo[0].Password)
	first := make(chan apitest.Response)
	go func() { first <- a.PIX(ana, "bruno@example.com", 100) }()
	ledger.arrived(t, "Ana's first PIX") // it holds her one place, in the ledger
	busy := a.PIX(ana, "bruno@example.com", 200)
	if busy.Status != http.StatusServiceUnavailable || busy.JSON(t)["error"] != "ledger_busy" || busy.Header.Get("Retry-After") != "1" {
		t.Errorf("Ana's second PIX while her share is held: %v, want 503 ledger_busy, Retry-After 1", busy)
	}
	ledger.open()
	if r := <-first; r.Status != http.StatusCreated {
		t.Fatalf("Ana's first PIX: %v", r)
	}
	if r := a.PIX(ana, "bruno@example.com", 300); r.Status != http.StatusCreated {
		t.Errorf("Ana's PIX after the busy one: %v, want 201: the busy one spent no quota", r)
	}
	if r := a.PIX(ana, "bruno@example.com", 400); r.Status != http.StatusTooManyRequests {
		t.Errorf("Ana's third admitted PIX: %v, want 429: exactly two were counted", r)
	}
	st, err := inner.Statement(t.Context(), "acct-ana", 10)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(st.Entries); n != 2 {
		t.Errorf("Ana's statement holds %d transfers, want 2: the busy PIX moved nothing", n)
	}
}

// TestAQueuedPIXRefusedAtItsTurnGivesItBack: on a queue (leaky_bucket, a turn every 5 s), Ana's
// first PIX is served at once and held in the ledger, holding her one place of the ledger (or her
// one in-flight slot); her second waits for its turn, then finds the place (or the slot) still
// held and is answered 503 ledger_busy (or 429 pix-concurrency): it moved nothing and gave its
// turn back, so the queue holds the first's place alone (a place stays a pace after its turn:
// the next turn counts from it), and the turns after it would have moved up.
func TestAQueuedPIXRefusedAtItsTurnGivesItBack(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name         string
		env          map[string]string
		status       int
		code, policy string
	}{
		{"ledger busy", map[string]string{"LEDGER_ACCOUNT_SHARE": "1"}, http.StatusServiceUnavailable, "ledger_busy", ""},
		{"in-flight slot held", map[string]string{"PIX_CONCURRENCY": "1"}, http.StatusTooManyRequests, "rate_limit_exceeded", `"pix-concurrency"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			inner, err := pix.NewMemoryLedger(apitest.DemoAccounts(t))
			if err != nil {
				t.Fatal(err)
			}
			ledger := newGated(inner, 16)
			srv := redistest.Start(t)
			env := map[string]string{"REDIS_TIMEOUT": "1s", "DB_TIMEOUT": "200ms",
				"PIX_ALGORITHM": "leaky_bucket", "PIX_LIMIT": "2", "PIX_WINDOW": "10s", "PIX_QUEUE": "1"}
			maps.Copy(env, tt.env)
			replicas, _ := fleet(t, srv, ledger, 1, env)
			t.Cleanup(ledger.open) // before the servers close: a PIX held at the gate goes on
			a := replicas[0]
			ana := a.Token(apitest.Demo[0].Document, apitest.Demo[0].Password)
			first := make(chan apitest.Response, 1)
			go func() { first <- a.PIX(ana, "bruno@example.com", 100) }()
			ledger.arrived(t, "Ana's first PIX") // served at once, and held in the ledger
			second := a.PIX(ana, "bruno@example.com", 200)
			if second.Status != tt.status || second.JSON(t)["error"] != tt.code || !strings.Contains(second.Header.Get("RateLimit-Policy"), tt.policy) {
				t.Fatalf("Ana's second PIX, at its turn: %v, want %d %s (%s)", second, tt.status, tt.code, tt.policy)
			}
			// The queue's key lives until a pace after the last turn it gave (the second's, 5 s
			// from the start): read before it goes.
			rdb := srv.Client(nil)
			keys := rdb.Keys(t.Context(), "rl:pix:leaky_bucket:*").Val()
			if len(keys) != 1 {
				t.Fatalf("the PIX queue's keys: %v, want one", keys)
			}
			if n := rdb.ZCard(t.Context(), keys[0]).Val(); n != 1 {
				t.Errorf("the PIX queue holds %d places after the refused PIX, want 1 (the first's): it gives its turn back", n)
			}
			ledger.open()
			if r := <-first; r.Status != http.StatusCreated {
				t.Fatalf("Ana's first PIX: %v", r)
			}
			st, err := inner.Statement(t.Context(), "acct-ana", 10)
			if err != nil {
				t.Fatal(err)
			}
			if n := len(st.Entries); n != 1 {
				t.Errorf("Ana's statement holds %d transfers, want 1: the refused PIX moved nothing", n)
			}
		})
	}
}

// TestAShadowLimitStillWaitsForTheKeysOriginal: with the PIX limit in shadow mode (1 a minute),
// Ana's original PIX of a key is held in the ledger on one replica; a second PIX of the key on the
// other replica, over the shadow limit (its refusal ends the admission's call before the mark),
// still makes no ledger call until the original has answered, and is then 409 for its other body.
func TestAShadowLimitStillWaitsForTheKeysOriginal(t *testing.T) {
	t.Parallel()
	ledger, replicas, ana := gatedFleet(t, 2, 4, map[string]string{"REDIS_TIMEOUT": "1s", "PIX_LIMIT": "1", "PIX_MODE": "shadow"})
	key := apitest.NewIdempotencyKey()
	first, second := make(chan apitest.Response, 1), make(chan apitest.Response, 1)
	go func() { first <- replicas[0].PIX(ana, "bruno@example.com", 100, "Idempotency-Key", key) }()
	ledger.arrived(t, "the original") // held at the gate
	go func() { second <- replicas[1].PIX(ana, "bruno@example.com", 200, "Idempotency-Key", key) }()
	select {
	case <-ledger.entered:
		t.Error("a PIX over its shadow limit reached the ledger while its key's original was in progress")
	case <-time.After(300 * time.Millisecond):
	}
	ledger.open()
	if r := <-first; r.Status != http.StatusCreated {
		t.Errorf("the original: %v, want 201", r)
	}
	if r := <-second; r.Status != http.StatusConflict {
		t.Errorf("the second PIX of the key, another body: %v, want 409", r)
	}
}

// TestAWaitForAnOriginalEndsByTheLongestTransfer: Ana's original PIX of a key is held in the
// ledger on one replica; a retry of it on the other waits for the original's mark at most the
// longest transfer (0.6 s with DB_TIMEOUT 200ms), as the contract says, not until the mark's
// lease lapses (3 s here) or MaxWait does (11.4 s): past it, it goes on to the ledger, which
// keeps the key's guarantees.
func TestAWaitForAnOriginalEndsByTheLongestTransfer(t *testing.T) {
	t.Parallel()
	ledger, replicas, ana := gatedFleet(t, 2, 4, map[string]string{"REDIS_TIMEOUT": "1s", "DB_TIMEOUT": "200ms", "PIX_CONCURRENCY": "0"})
	key := apitest.NewIdempotencyKey()
	first, second := make(chan apitest.Response, 1), make(chan apitest.Response, 1)
	go func() { first <- replicas[0].PIX(ana, "bruno@example.com", 100, "Idempotency-Key", key) }()
	ledger.arrived(t, "the original") // held at the gate, holding the key's mark
	sent := time.Now()
	go func() { second <- replicas[1].PIX(ana, "bruno@example.com", 100, "Idempotency-Key", key) }()
	select {
	case <-ledger.entered:
		if waited := time.Since(sent); waited < 600*time.Millisecond || waited > 2200*time.Millisecond {
			t.Errorf("the retry reached the ledger after %v, want after its wait for the original's mark, 0.6 s, and well before the mark's lease, 3 s", waited)
		}
	case <-time.After(30 * time.Second):
		t.Error("the retry did not reach the ledger within 30s")
	}
	ledger.open()
	for _, r := range []apitest.Response{<-first, <-second} {
		if r.Status != http.StatusCreated {
			t.Errorf("the original or its retry: %v, want 201", r)
		}
	}
}

// pixLog reads how many admissions the one account's pix log in srv holds (its sorted set: the
// default algorithm), 0 before there is one.
func pixLog(t *testing.T, srv *redistest.Server) func() int64 {
	t.Helper()
	rdb := srv.Client(nil)
	t.Cleanup(func() { _ = rdb.Close() })
	return func() int64 {
		keys, err := rdb.Keys(t.Context(), "rl:pix:{*").Result()
		if err != nil || len(keys) > 1 {
			t.Fatalf("pix logs %v: %v, want one account's at most", keys, err)
		}
		if len(keys) == 0 {
			return 0
		}
		return rdb.ZCard(t.Context(), keys[0]).Val()
	}
}

// TestAQueuedPIXsWaitsEndTogether: on a queue (leaky_bucket, a turn every 2 s), a PIX that
// waited for its key's original until its longest wait (MaxWait, 4.6 s here) is not then offered
// a turn a further MaxWait away: its waits and its turn's end together, or the answer could come
// past the write timeout. Ana's original is held in the ledger, and her next two PIX take the
// next two turns (2 s and 4 s); a retry of the original, waiting for it, finds the turn after
// those (6 s) past its wait: 429 at once, never the ledger.
func TestAQueuedPIXsWaitsEndTogether(t *testing.T) {
	t.Parallel()
	// MaxWait: the write timeout less a second, the two limiter calls and the longest transfer.
	ledger, replicas, ana := gatedFleet(t, 1, 16, map[string]string{"REDIS_TIMEOUT": "100ms", "DB_TIMEOUT": "4100ms",
		"PIX_CONCURRENCY": "0", "PIX_ALGORITHM": "leaky_bucket", "PIX_LIMIT": "30", "PIX_WINDOW": "1m", "PIX_QUEUE": "2",
		"LEDGER_ACCOUNT_SHARE": "3"}) // a place of the ledger for each PIX held there
	a := replicas[0]
	results := make(chan apitest.Response, 4)
	send := func(key string) {
		go func() { results <- a.PIX(ana, "bruno@example.com", 100, "Idempotency-Key", key) }()
	}
	send("original")
	ledger.arrived(t, "the original") // its turn at once
	send("next")                      // 2 s later
	send("after")                     // 4 s later
	send("original")                  // the retry: waits for the original until its MaxWait, 4.6 s
	ledger.arrived(t, "the next PIX")
	ledger.arrived(t, "the PIX after it")
	select {
	case r := <-results:
		if r.Status != http.StatusTooManyRequests || r.Header.Get("Retry-After") == "" {
			t.Errorf("the retry, its wait spent: %v, want 429 with Retry-After", r)
		}
	case <-ledger.entered:
		t.Fatal("the retry was offered a turn past its wait, and reached the ledger")
	case <-time.After(30 * time.Second):
		t.Fatal("no answer to the retry within 30s")
	}
	ledger.open()
	for range 3 {
		if r := <-results; r.Status != http.StatusCreated {
			t.Errorf("a PIX served at its turn: %v, want 201", r)
		}
	}
}

// scripted is a ledger whose first transfers each wait for the test's word, then fail with it (nil:
// go on); later ones pass at once. entered hears each transfer's number as it arrives.
type scripted struct {
	pix.Ledger
	n       atomic.Int32
	entered chan int
	words   []chan error
}

func (l *scripted) Transfer(ctx context.Context, r pix.TransferRequest) (pix.Receipt, error) {
	i := int(l.n.Add(1)) - 1
	l.entered <- i
	if i < len(l.words) {
		if err := <-l.words[i]; err != nil {
			return pix.Receipt{}, err
		}
	}
	return l.Ledger.Transfer(ctx, r)
}

// TestAReplayThatTookItsMarkRenewsItsSlot: with one in-flight slot a PIX (CONCURRENCY_LEASE 3s),
// Ana's PIX is in the ledger on one replica and its retry, on the other, shares its slot and waits
// for its mark. The original fails a second later (503, nothing recorded), and the retry takes
// the mark and goes to the ledger itself, its slot's lease counting again from then: a third PIX,
// 3.3 s after the retry took its slot, is refused pix-concurrency while the retry is in the
// ledger. (Its lease counted from its admission, the slot had freed at 3 s, and two of Ana's PIX
// were in the ledger at once.)
func TestAReplayThatTookItsMarkRenewsItsSlot(t *testing.T) {
	t.Parallel()
	inner, err := pix.NewMemoryLedger(apitest.DemoAccounts(t))
	if err != nil {
		t.Fatal(err)
	}
	ledger := &scripted{Ledger: inner, entered: make(chan int, 8), words: []chan error{make(chan error, 1), make(chan error, 1)}}
	srv := redistest.Start(t)
	replicas, _ := fleet(t, srv, ledger, 2, map[string]string{"REDIS_TIMEOUT": "200ms", "DB_TIMEOUT": "500ms",
		"PIX_CONCURRENCY": "1", "CONCURRENCY_LEASE": "3s"})
	for _, w := range ledger.words { // nothing held in the ledger as the servers close (cleanups run last first)
		t.Cleanup(func() {
			select {
			case w <- nil:
			default:
			}
		})
	}
	ana := replicas[0].Token(apitest.Demo[0].Document, apitest.Demo[0].Password)
	key := apitest.NewIdempotencyKey()
	original, retry := make(chan apitest.Response, 1), make(chan apitest.Response, 1)
	go func() { original <- replicas[0].PIX(ana, "bruno@example.com", 100, "Idempotency-Key", key) }()
	if i := <-ledger.entered; i != 0 {
		t.Fatalf("transfer %d first", i)
	}
	go func() { retry <- replicas[1].PIX(ana, "bruno@example.com", 100, "Idempotency-Key", key) }()
	rdb := srv.Client(nil)
	var held time.Time // by then the retry holds its slot, its lease ending 3 s after at the latest
	for deadline := time.Now().Add(10 * time.Second); held.IsZero(); time.Sleep(time.Millisecond) {
		for _, k := range rdb.Keys(t.Context(), "rl:pix-concurrency:*").Val() {
			if rdb.ZCard(t.Context(), k).Val() == 2 { // the original's hold and the retry's
				held = time.Now()
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the retry holds no slot within 10s")
		}
	}
	<-time.After(time.Until(held.Add(time.Second))) // within the retry's wait for its mark (1.5 s)
	ledger.words[0] <- pix.ErrUnavailable
	if r := <-original; r.Status != http.StatusServiceUnavailable {
		t.Fatalf("the original: %v, want 503 ledger_unavailable", r)
	}
	if i := <-ledger.entered; i != 1 {
		t.Fatalf("transfer %d second, want the retry's", i)
	}
	<-time.After(time.Until(held.Add(3300 * time.Millisecond)))
	third := replicas[0].PIX(ana, "bruno@example.com", 100)
	ledger.words[1] <- nil
	if r := <-retry; r.Status != http.StatusCreated {
		t.Errorf("the retry: %v, want 201", r)
	}
	if third.Status != http.StatusTooManyRequests || !strings.Contains(third.Header.Get("RateLimit"), "pix-concurrency") {
		t.Errorf("a third PIX while the retry is in the ledger, 3.3 s after it took its slot: %v, want 429 pix-concurrency (PIX_CONCURRENCY 1)", third)
	}
}
