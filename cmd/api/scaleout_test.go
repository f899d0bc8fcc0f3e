package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pixlimit/pixlimit/internal/testing/apitest"
	"github.com/pixlimit/pixlimit/internal/testing/redistest"
	"github.com/pixlimit/pixlimit/internal/testing/stalls"
)

// TestOnRedisCluster runs two API processes on a 3-master cluster: the login's two keys live in
// different slots and still decide as one.
func TestOnRedisCluster(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t, 3, 1)
	env := map[string]string{"REDIS_CLUSTER_ADDRS": strings.Join(c.Addrs(), ","), "TRUSTED_PROXIES": "127.0.0.1/32",
		"REDIS_TIMEOUT": "800ms", "DB_TIMEOUT": "1s"} // a PIX's 12 calls on a cluster and its ledger fit the write timeout
	replicas := []*api{startAPI(t, nil, env), startAPI(t, nil, env)}
	for i := range 8 { // a botnet on Carla's document: 5 guesses, then the document key refuses
		r := replicas[i%2].Login(demo[2].Document, "guess", "X-Forwarded-For", fmt.Sprintf("203.0.113.%d", i+1))
		if want := map[bool]int{true: 429, false: 401}[i >= 5]; r.Status != want {
			t.Fatalf("guess %d: %v, want %d", i+1, r, want)
		}
	}
	for i := range 12 { // one IP, many documents: 10, then the IP key refuses
		r := replicas[i%2].Login(apitest.CPF(900+i), "guess", "X-Forwarded-For", "198.51.100.99")
		if want := map[bool]int{true: 429, false: 401}[i >= 10]; r.Status != want {
			t.Fatalf("document %d from one IP: %v, want %d", i+1, r, want)
		}
	}
	// 203.0.113.7's guess was refused by the document key (in another slot, after its own key
	// had admitted it): that admission is withdrawn just after the answer, so the IP still has all
	// 10 attempts. Only the 10th needs the withdrawal to have landed: if it has not yet (a busy
	// machine), it is refused, which records nothing, and sent again.
	for i := range 10 {
		r := replicas[i%2].Login(apitest.CPF(950+i), "guess", "X-Forwarded-For", "203.0.113.7")
		for deadline := time.Now().Add(5 * time.Second); i == 9 && r.Status == http.StatusTooManyRequests && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond)
			r = replicas[i%2].Login(apitest.CPF(950+i), "guess", "X-Forwarded-For", "203.0.113.7")
		}
		if r.Status != http.StatusUnauthorized {
			t.Fatalf("attempt %d from an IP whose guess was refused: %v, want 401", i+1, r)
		}
	}
}

// TestAPIXRefusedItsSlotOnAClusterSpendsNoQuota: on a cluster a PIX's admission is a call per
// step, so the account's one in-flight slot (PIX_CONCURRENCY 1) is taken before the PIX's own
// limit decides: PIX sent together are refused pix-concurrency having spent nothing of the
// limit, which counts the created ones alone. (Asked, then taken after the limit, the slot could
// go to another PIX in between, and a refused PIX kept its admission.) Nor of her look-up bucket:
// a PIX takes a miss's price after its slot, and gives it back when its key is found.
func TestAPIXRefusedItsSlotOnAClusterSpendsNoQuota(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t, 3, 0)
	a := startAPI(t, nil, map[string]string{"REDIS_CLUSTER_ADDRS": strings.Join(c.Addrs(), ","),
		"REDIS_TIMEOUT": "800ms", "DB_TIMEOUT": "1s", "PIX_LIMIT": "1000", "PIX_CONCURRENCY": "1"})
	tok := a.Token(demo[0].Document, demo[0].Password)
	created, refused := 0, 0
	for burst := 0; burst < 5 && refused == 0; burst++ { // PIX overlap on any machine within a few bursts
		var mu sync.Mutex
		var wg sync.WaitGroup
		for range 30 {
			wg.Go(func() {
				r := a.PIX(tok, "bruno@example.com", 1)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case r.Status == http.StatusCreated:
					created++
				case r.Status == http.StatusTooManyRequests && strings.Contains(r.Header.Get("RateLimit"), "pix-concurrency"):
					refused++
				default:
					t.Errorf("a PIX of the burst: %v, want 201 or 429 pix-concurrency", r)
				}
			})
		}
		wg.Wait()
	}
	if refused == 0 {
		t.Fatalf("%d PIX created, none refused pix-concurrency in five bursts of 30: nothing was tested", created)
	}
	r := a.PIX(tok, "bruno@example.com", 1)
	if r.Status != http.StatusCreated {
		t.Fatalf("a PIX after the bursts: %v", r)
	}
	if got, want := r.Header.Get("RateLimit-Remaining"), fmt.Sprint(1000-created-1); got != want {
		t.Errorf("after %d PIX created and %d refused pix-concurrency: %s of the limit left, want %s (the created ones alone spent it)", created+1, refused, got, want)
	}
	if r := a.Do(http.MethodGet, "/v1/pix/keys/bruno@example.com", nil, "Authorization", "Bearer "+tok); r.Status != http.StatusOK ||
		r.Header.Get("RateLimit-Remaining") != "99" {
		t.Errorf("a look-up after the PIX: %v, RateLimit-Remaining %q, want 200 and 99 (every PIX's price given back)", r, r.Header.Get("RateLimit-Remaining"))
	}
}

// TestSentinelFailover runs the API on a master watched by three sentinels, kills the master,
// and keeps serving through the replica they promote.
func TestSentinelFailover(t *testing.T) {
	t.Parallel()
	st := redistest.StartSentinel(t, 1)
	a := startAPI(t, nil, map[string]string{
		"REDIS_SENTINEL_ADDRS": strings.Join(st.Addrs(), ","), "REDIS_SENTINEL_MASTER": redistest.MasterName,
		"REDIS_TIMEOUT": "300ms", "PIX_LIMIT": "1000",
	})
	tok := a.Token(demo[0].Document, demo[0].Password)
	if r := a.PIX(tok, "bruno@example.com", 1); r.Status != http.StatusCreated {
		t.Fatalf("before the failover: %v", r)
	}
	meter := stalls.Watch(t)
	st.Master.Kill()
	killed := time.Now()
	refused := 0
	for {
		r := a.PIX(tok, "bruno@example.com", 1)
		// A PIX makes at most three limiter calls (its admission; then its settlement, or the
		// release of what a failed admission may hold), each within the 300ms budget; a busy
		// machine (four CPU burners beside the suite) adds up to a second of scheduling. Without
		// budgets, go-redis would wait its 5s dial timeout, and retry.
		if longest, took := 3*300*time.Millisecond+time.Second, meter.Just(r.Took); took > longest {
			t.Errorf("a PIX during the failover took %v less the process's stalls (%d), want within three 300ms budgets and a second (%v)", took, r.Status, longest)
		}
		if r.Status == http.StatusCreated {
			break
		}
		if r.Status != http.StatusTooManyRequests || r.JSON(t)["error"] != "rate_limiter_unavailable" {
			t.Fatalf("during the failover: %v, want 429 rate_limiter_unavailable (fail closed)", r)
		}
		refused++
		if time.Since(killed) > 30*time.Second {
			t.Fatal("not serving 30s after the master died")
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("sentinel failover: PIX failed closed %d times for %v, then the promoted replica answered",
		refused, time.Since(killed).Round(time.Millisecond))
	if r := a.Statement(tok); r.Status != http.StatusOK || r.Header.Get("RateLimit-Limit") == "" {
		t.Errorf("after the failover: statement %v %v, want 200 with RateLimit headers", r, r.Header)
	}
}

// TestAQueuedPIXRefusedFromMemoryGivesNoPriceBack: on a cluster a queued PIX's steps are calls of
// their own, its look-up price before its limit. With Ana's one place of a PIX queue (a turn every
// 3 s) taken by a PIX waiting here, a replica that holds her share of waiters (THROTTLE_MAX_WAITING
// 2) refuses her next PIX from memory, the steps before the queue's reported admitted unasked:
// nothing was charged, so nothing is given back. Her look-up bucket, emptied, stays empty.
func TestAQueuedPIXRefusedFromMemoryGivesNoPriceBack(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t, 3, 0)
	a := startAPI(t, nil, map[string]string{"REDIS_CLUSTER_ADDRS": strings.Join(c.Addrs(), ","), "REDIS_TIMEOUT": "600ms",
		"DB_TIMEOUT": "500ms", "PIX_ALGORITHM": "leaky_bucket", "PIX_LIMIT": "20", "PIX_WINDOW": "1m", "PIX_QUEUE": "1", "THROTTLE_MAX_WAITING": "2"})
	ana := a.Token(demo[0].Document, demo[0].Password)
	lookUp := func(key string) int {
		return a.Do(http.MethodGet, "/v1/pix/keys/"+key, nil, "Authorization", "Bearer "+ana).Status
	}
	if r := a.PIX(ana, "bruno@example.com", 1); r.Status != http.StatusCreated { // served at once, its price given back
		t.Fatalf("Ana's first PIX: %v", r)
	}
	waiting := make(chan apitest.Response, 1)
	go func() { waiting <- a.PIX(ana, "bruno@example.com", 1) }() // its turn 3 s away, its price taken
	rdb := c.Client(nil)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) { // until it waits
		var places int64
		_ = rdb.ForEachMaster(t.Context(), func(ctx context.Context, m *redis.Client) error {
			for _, k := range m.Keys(ctx, "rl:pix:leaky_bucket:*").Val() {
				atomic.AddInt64(&places, m.ZCard(ctx, k).Val())
			}
			return nil
		})
		if places == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Ana's second PIX not waiting its turn within 10s (%d places)", places)
		}
	}
	for i := 0; lookUp(fmt.Sprintf("ghost%d@example.com", i)) == http.StatusNotFound; i++ { // her bucket emptied
		if i == 10 {
			t.Fatal("10 misses answered: her bucket never empties")
		}
	}
	for i := range 5 {
		if r := a.PIX(ana, "bruno@example.com", 1); r.Status != http.StatusTooManyRequests {
			t.Fatalf("Ana's PIX %d while one waits: %v, want 429", i+3, r)
		}
		if s := lookUp(fmt.Sprintf("scan%d@example.com", i)); s != http.StatusTooManyRequests {
			t.Fatalf("a look-up after Ana's PIX %d refused from memory: %d, want 429 (her bucket still empty: no price was given back)", i+3, s)
		}
	}
	if r := <-waiting; r.Status != http.StatusCreated {
		t.Errorf("Ana's waiting PIX: %v, want 201 at its turn", r)
	}
}
