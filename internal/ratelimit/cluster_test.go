package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pixlimit/pixlimit/internal/testing/redistest"
	"github.com/pixlimit/pixlimit/internal/testing/stalls"
)

// TestSplitDecisionWithdraws forces the cluster path on one node, for every algorithm: when the
// second key refuses, the first key's admission is withdrawn and its quota is whole again.
func TestSplitDecisionWithdraws(t *testing.T) {
	for _, a := range meters() {
		t.Run(string(a), func(t *testing.T) {
			t.Parallel()
			l, _, _ := newTestLimiter(t)
			l.cluster = true
			open := Check{Policy{Name: "open", Limit: 4, Window: time.Minute, Algorithm: a}, "x"}
			full := Check{Policy{Name: "full", Limit: 1, Window: time.Minute, Algorithm: a}, "x"}
			mustAllow(t, l, full)
			for i := range 5 {
				l.withdrawals.Wait() // else the last request's admission may still be held (see decideApart)
				d := mustAllow(t, l, open, full)
				if d.Allowed {
					t.Fatalf("request %d admitted with a full key", i+1)
				}
				if got := d.Results[0].Remaining; got != 4 {
					t.Errorf("request %d: open key reports %d remaining, want 4 (its admission given back)", i+1, got)
				}
			}
			l.withdrawals.Wait()
			if d := mustAllow(t, l, open); !d.Allowed || d.Worst.Remaining != 3 {
				t.Errorf("after 5 refused requests: allowed=%v remaining=%d, want true, 3: the refusals consumed quota", d.Allowed, d.Worst.Remaining)
			}
		})
	}
}

// TestSplitAskWithdrawsNothing: on the cluster path an ask (AskAll) took nothing, so a refusal
// by one bucket gives nothing "back" to the other: a withdrawal there would add a token.
func TestSplitAskWithdrawsNothing(t *testing.T) {
	t.Parallel()
	l, _, _ := newTestLimiter(t)
	l.cluster = true
	l.deny = nil // every ask goes to Redis, on the split path
	withClock(l)
	ctx := context.Background()
	bucket := func(name string, burst int) Check {
		return Check{Policy{Name: name, Limit: 2, Window: time.Minute, Algorithm: TokenBucket, Burst: burst}, "x"}
	}
	user, bank := bucket("user", 3), bucket("bank", 1)
	mustAllow(t, l, user)
	mustAllow(t, l, bank) // the bank's bucket is empty
	for range 3 {
		d, err := l.AskAll(ctx, user, bank)
		if err != nil || d.Allowed || d.Results[0].Remaining != 2 || d.Results[1].RetryAfter == 0 {
			t.Fatalf("asking with the bank's bucket empty: %+v, %v; want refused by it, the user's at 2", d, err)
		}
	}
	l.withdrawals.Wait()
	if d, _ := l.AskAll(ctx, user); !d.Allowed || d.Worst.Remaining != 2 {
		t.Errorf("after three refused asks: %+v, want the user's bucket at 2, as before", d.Worst)
	}
}

func clusterLimiters(t *testing.T, c *redistest.Cluster, n int, timeout time.Duration) []*Limiter {
	t.Helper()
	ls := make([]*Limiter, n)
	for i := range ls {
		opt := &redis.UniversalOptions{Addrs: c.Addrs(), IsClusterMode: true}
		UniversalClientOptions(opt, timeout) // as the API configures it
		rc := redis.NewUniversalClient(opt)
		t.Cleanup(func() { _ = rc.Close() })
		l, err := New(rc, Options{KeySecret: testSecret, Timeout: timeout})
		if err != nil {
			t.Fatal(err)
		}
		if !l.cluster {
			t.Fatal("a cluster client was not recognized")
		}
		ls[i] = l
	}
	return ls
}

// TestClusterExactness: 3 clients × 64 goroutines, 60 decisions each, on a 3-master, 3-replica
// cluster, over 1,000 single keys (limit 5) and login-like pairs of keys in different slots (100
// IPs at 10, 50 documents at 5): about 6 tries a single key and 115 a document, so most keys are
// fought over and most pairs refused. No key admits past its limit. Then, the withdrawals
// landed, each key is topped up one request at a time until it refuses, and every key has
// admitted exactly its limit, and holds exactly the admissions that involved it: a refused pair
// consumed nothing. Whatever the machine's speed: the work is counted, not timed, and a decision
// that failed under load (its fail mode answered) is withdrawn like a refused one.
func TestClusterExactness(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t, 3, 1)
	ls := clusterLimiters(t, c, 3, generous)
	var heldMu sync.Mutex
	var held []time.Duration
	for _, l := range ls {
		l.withdrawn = func(d time.Duration) { heldMu.Lock(); held = append(held, d); heldMu.Unlock() }
	}
	single := Policy{Name: "single", Limit: 5, Window: time.Hour}
	ip := Policy{Name: "login-ip", Limit: 10, Window: time.Hour}
	doc := Policy{Name: "login-account", Limit: 5, Window: time.Hour}

	var (
		mu        sync.Mutex
		singles   = map[int]int{}
		ips, docs = map[int]int{}, map[int]int{}
		errs      atomic.Int64
	)
	// record counts one decision's admission under the lock.
	record := func(allowed bool, err error, admitted func()) {
		if err != nil {
			errs.Add(1)
			return
		}
		if allowed {
			mu.Lock()
			admitted()
			mu.Unlock()
		}
	}
	const perGoroutine = 60
	var wg sync.WaitGroup
	for r, l := range ls {
		for g := range 64 {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(r), uint64(g)))
				for range perGoroutine {
					if rng.IntN(2) == 0 {
						k := rng.IntN(1000)
						d, err := l.Allow(context.Background(), single, fmt.Sprint("k", k))
						record(d.Allowed, err, func() { singles[k]++ })
						continue
					}
					i, j := rng.IntN(100), rng.IntN(50)
					d, err := l.AllowAll(context.Background(), Check{ip, fmt.Sprint("ip", i)}, Check{doc, fmt.Sprint("doc", j)})
					record(d.Allowed, err, func() { ips[i]++; docs[j]++ })
				}
			})
		}
	}
	wg.Wait()
	settle := func() {
		for _, l := range ls {
			l.withdrawals.Wait()
		}
	}
	settle()
	t.Logf("%d decisions at once, %d failed (their fail mode answered; withdrawn like refusals)", 3*64*perGoroutine, errs.Load())
	over := func(what string, got map[int]int, limit int) {
		for k, n := range got {
			if n > limit {
				t.Errorf("%s %d admitted %d, over its limit %d", what, k, n, limit)
			}
		}
	}
	over("key", singles, single.Limit)
	over("IP", ips, ip.Limit)
	over("document", docs, doc.Limit)

	// Top up, one request at a time, until each key refuses. A decision that fails (a timeout on
	// a loaded machine) is withdrawn, then asked again.
	l := ls[0]
	decide := func(checks ...Check) Decision {
		t.Helper()
		for try := 1; ; try++ {
			d, err := l.AllowAll(context.Background(), checks...)
			if err == nil {
				return d
			}
			if try == 10 {
				t.Fatalf("topping up %v: %v", checks, err)
			}
			settle()
		}
	}
	for k := range 1000 {
		for {
			if d := decide(Check{single, fmt.Sprint("k", k)}); !d.Allowed {
				break
			}
			singles[k]++
		}
	}
	next := 0 // the IP to pair with a document: one with room
	for j := range 50 {
		for {
			for ips[next] >= ip.Limit {
				next++
			}
			d := decide(Check{ip, fmt.Sprint("ip", next)}, Check{doc, fmt.Sprint("doc", j)})
			if d.Allowed {
				ips[next]++
				docs[j]++
				continue
			}
			settle() // the refused pair's admission in the IP key is withdrawn
			if d.Results[1].RetryAfter > 0 {
				break // the document is full
			}
			t.Fatalf("document %d: a pair refused by IP %d, which has admitted %d of %d", j, next, ips[next], ip.Limit)
		}
	}
	settle()

	rc := c.Client(nil)
	count := func(p Policy, id string) int {
		n, err := rc.ZCard(context.Background(), ls[0].keys.key(p, id)).Result()
		if err != nil {
			t.Fatal(err)
		}
		return int(n)
	}
	for k := range 1000 {
		if singles[k] != single.Limit {
			t.Errorf("key k%d admitted %d, want exactly %d", k, singles[k], single.Limit)
		}
		if n := count(single, fmt.Sprint("k", k)); n != singles[k] {
			t.Errorf("key k%d holds %d entries for %d admissions", k, n, singles[k])
		}
	}
	for j := range 50 {
		if docs[j] != doc.Limit {
			t.Errorf("document %d admitted %d, want exactly %d", j, docs[j], doc.Limit)
		}
		if n := count(doc, fmt.Sprint("doc", j)); n != docs[j] {
			t.Errorf("document %d holds %d entries for %d admissions: refused pairs left quota taken", j, n, docs[j])
		}
	}
	for i := range 100 {
		if ips[i] > ip.Limit {
			t.Errorf("IP %d admitted %d, over its limit %d", i, ips[i], ip.Limit)
		}
		if n := count(ip, fmt.Sprint("ip", i)); n != ips[i] {
			t.Errorf("IP %d holds %d entries for %d admissions: refused pairs left quota taken", i, n, ips[i])
		}
	}
	for _, l := range ls {
		if lost := l.Stats().WithdrawalsLost; lost != 0 {
			t.Errorf("%d withdrawals lost, want none", lost)
		}
	}
	slices.Sort(held)
	if len(held) > 0 {
		t.Logf("withdrawn admissions: %d; held after the decision for p50 %v, p99 %v, max %v (the window of imprecision)",
			len(held), held[len(held)/2], held[len(held)*99/100], held[len(held)-1])
	}
}

// TestClusterFailover kills the master serving a key while three clients decide on it: during
// the gap decisions fail within the budget (the route's fail mode answers), the replica takes
// over, and decisions are exact again on it.
func TestClusterFailover(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t, 3, 1)
	const budget = 200 * time.Millisecond
	ls := clusterLimiters(t, c, 3, budget)
	p := Policy{Name: "failover", Limit: 1_000_000, Window: time.Hour}
	key := ls[0].keys.key(p, "victim")
	master := c.MasterOf(key)

	var lastErr, firstOKAfter atomic.Int64 // unix µs
	var slow atomic.Int64
	meter := stalls.Watch(t) // a loaded runner's stalls are not the budget's
	killed := make(chan time.Time, 1)
	var killedAt atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, l := range ls {
		for range 8 {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					start := time.Now()
					_, err := l.Allow(context.Background(), p, "victim")
					if meter.Took(start) > budget+100*time.Millisecond {
						slow.Add(1)
					}
					if err != nil {
						if !errors.Is(err, ErrUnavailable) {
							t.Errorf("failover: %v, want ErrUnavailable", err)
						}
						lastErr.Store(time.Now().UnixMicro())
						time.Sleep(10 * time.Millisecond)
					} else if k := killedAt.Load(); k != 0 && lastErr.Load() > k {
						firstOKAfter.CompareAndSwap(0, time.Now().UnixMicro())
					}
				}
			})
		}
	}
	time.Sleep(time.Second)
	killedAt.Store(time.Now().UnixMicro())
	master.Kill()
	killed <- time.Now()
	// A bound, not a figure: a failover takes about 2 s here, and up to half a minute on a
	// machine whose other work starves the Redis processes.
	deadline := time.Now().Add(60 * time.Second)
	for firstOKAfter.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	if firstOKAfter.Load() == 0 {
		t.Fatal("no decision succeeded within 60s of killing the master")
	}
	gap := time.Duration(firstOKAfter.Load()-killedAt.Load()) * time.Microsecond
	t.Logf("master killed: decisions on its slots failed (fail mode) for %v, then the promoted replica answered", gap.Round(time.Millisecond))
	if n := slow.Load(); n > 0 {
		t.Errorf("%d decisions waited past the %v budget", n, budget)
	}

	// Exact again on the promoted replica: 64 concurrent requests, limit 10, counted by clients
	// with a budget of their own (the 200 ms one is the fail mode's, measured above; a loaded
	// machine's burst of 64 can outlast it, and a timeout is not what this counts).
	c.WaitHealthy(30 * time.Second)
	exact := Policy{Name: "after-failover", Limit: 10, Window: time.Hour}
	if c.MasterOf(ls[0].keys.key(exact, "victim")) == master {
		t.Fatal("the dead master still serves the slot")
	}
	// A client whose last failure came before the promotion still holds the slot map it then
	// reloaded, naming the dead master: its next decision fails (its fail mode answers) and
	// reloads the map. Each client learns it here, on a key of its own, before the count.
	for i, l := range ls {
		learn := Policy{Name: fmt.Sprint("learn-", i), Limit: 1, Window: time.Hour}
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			_, err := l.Allow(context.Background(), learn, "victim")
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("client %d: no decision within 30s of the cluster's recovery: %v", i, err)
			}
		}
	}
	// Warmed (slot map, scripts, connections) and with a budget no loaded machine outlasts: one
	// run beside two CPU burners timed out at a second, cold.
	counters := clusterLimiters(t, c, 3, 10*time.Second)
	for _, l := range counters {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if err := l.Warm(ctx, 22); err != nil {
			t.Fatal(err)
		}
		cancel()
	}
	var admitted atomic.Int64
	var wg2 sync.WaitGroup
	for g := range 64 {
		wg2.Go(func() {
			d, err := counters[g%3].Allow(context.Background(), exact, "victim")
			if err != nil {
				t.Errorf("after failover: %v", err)
			}
			if d.Allowed {
				admitted.Add(1)
			}
		})
	}
	wg2.Wait()
	if got := admitted.Load(); got != 10 {
		t.Errorf("after failover: %d of 64 admitted, want exactly 10", got)
	}
}

// TestClusterModeSurvivesAWrapper: a client that wraps a cluster client is not recognized by its
// type, so Options.Cluster declares it; nothing is decided in one script across slots then.
func TestClusterModeSurvivesAWrapper(t *testing.T) {
	t.Parallel()
	type wrapped struct{ redis.Scripter }
	plain := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer plain.Close()
	for _, tt := range []struct {
		opts Options
		want bool
	}{{Options{KeySecret: testSecret}, false}, {Options{KeySecret: testSecret, Cluster: true}, true}} {
		l, err := New(wrapped{plain}, tt.opts)
		if err != nil {
			t.Fatal(err)
		}
		if l.cluster != tt.want {
			t.Errorf("Options.Cluster=%v: cluster mode %v, want %v", tt.opts.Cluster, l.cluster, tt.want)
		}
	}
}

// TestAColdFleetDecidesItsFirstBurst: on a 3-master cluster whose scripts were flushed, a fresh
// client and Limiter, warmed as a replica is before it listens, decide their first burst of 40
// concurrent two-key decisions (keys in different slots): none paid for NOSCRIPT (no EVAL
// reached any master: every script was there), and none was unavailable, ten fleets in a row.
// Cold, the dials, the slot map and NOSCRIPT fell inside the decisions' budgets, and on a busy
// machine up to 8 of 20 failed closed. What proves the warm-up, whatever the machine's load, is
// the EVAL count; the budget is a generous one (a second), since two CPU burners beside the
// suite once failed 26 of 40 warmed decisions at 300 ms, and a timeout is not what this counts.
func TestAColdFleetDecidesItsFirstBurst(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t, 3, 0)
	ip, doc := policy("login-ip", 1000, time.Minute), policy("login-account", 1000, time.Minute)
	var mu sync.Mutex
	for fleet := range 10 {
		flush := c.Client(nil)
		if err := flush.ForEachShard(context.Background(), func(ctx context.Context, s *redis.Client) error {
			return s.ScriptFlush(ctx).Err()
		}); err != nil {
			t.Fatal(err)
		}
		l := clusterLimiters(t, c, 1, generous)[0]
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := l.Warm(ctx, 20)
		cancel()
		if err != nil {
			t.Fatalf("fleet %d: warm: %v", fleet, err)
		}
		evals := func() int {
			n := 0
			_ = flush.ForEachMaster(context.Background(), func(ctx context.Context, s *redis.Client) error {
				info, err := s.Info(ctx, "commandstats").Result()
				if _, rest, ok := strings.Cut(info, "cmdstat_eval:calls="); ok && err == nil {
					calls, _, _ := strings.Cut(rest, ",")
					v, _ := strconv.Atoi(calls)
					mu.Lock()
					n += v
					mu.Unlock()
				}
				return nil
			})
			return n
		}
		before := evals()
		var unavailable atomic.Int64
		var wg sync.WaitGroup
		for i := range 40 {
			wg.Go(func() {
				_, err := l.AllowAll(context.Background(), Check{ip, fmt.Sprintf("ip-%d-%d", fleet, i)}, Check{doc, fmt.Sprintf("doc-%d-%d", fleet, i)})
				if err != nil {
					unavailable.Add(1)
				}
			})
		}
		wg.Wait()
		if n := unavailable.Load(); n > 0 {
			t.Errorf("fleet %d: %d of its first 40 decisions unavailable, want none", fleet, n)
		}
		if n := evals() - before; n > 0 {
			t.Errorf("fleet %d: %d EVALs during its first burst: decisions paid for NOSCRIPT", fleet, n)
		}
	}
}
