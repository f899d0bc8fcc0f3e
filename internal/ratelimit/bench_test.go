package ratelimit_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	. "github.com/pixlimit/pixlimit/internal/ratelimit"
	"github.com/pixlimit/pixlimit/internal/ratelimit/batch"
	"github.com/pixlimit/pixlimit/internal/testing/redistest"
)

// BenchmarkDecision compares one decision of each algorithm of this package with one of
// go-redis/redis_rate (GCRA, the usual peer) on the same private redis-server, in the same run: 10,000 identities in turn,
// 1,000 requests per minute each, so nearly every request is admitted and recorded, the costlier
// path. p=16 runs 16 goroutines over one client, as 16 concurrent requests on one replica would.
// Both get the same client and the same per-decision deadline (Limiter applies its Timeout; the
// peer's calls get a context with the same one), since a deadline costs a few microseconds of
// timer work per call and production needs it either way.
//
//	go test -run '^$' -bench Decision -benchtime 3s ./internal/ratelimit
func BenchmarkDecision(b *testing.B) {
	rdb, l, peer, ids := benchSetup(b)
	alone, err := New(rdb, Options{KeySecret: benchSecret, Timeout: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	// Every invocation of a benchmark function starts on fresh keys, so keys hold about
	// b.N/10,000 entries each, whatever the ramp-up and -count did before.
	var round atomic.Int64
	fresh := func(name string) Policy {
		return Policy{Name: fmt.Sprint(name, "-", round.Add(1)), Limit: 1000, Window: time.Minute}
	}

	for _, par := range []int{1, 16, 64} {
		for _, row := range []struct {
			name string
			l    *Limiter
			algs []Algorithm
		}{{"one_key", l, slices.DeleteFunc(Algorithms(), func(a Algorithm) bool { return a == LeakyBucket })}, {"one_key_unbatched", alone, []Algorithm{SlidingLog, SlidingLogPacked}}} {
			for _, a := range row.algs {
				b.Run(fmt.Sprintf("%s/%s/p=%d", a, row.name, par), func(b *testing.B) {
					p := fresh("one")
					p.Algorithm = a
					measure(b, rdb, par, func(i int) error {
						_, err := row.l.AllowAll(ctx, Check{Policy: p, Identity: ids[i%len(ids)]})
						return err
					})
				})
			}
		}
		for _, a := range []Algorithm{SlidingLog, SlidingLogPacked} {
			b.Run(fmt.Sprintf("%s/two_keys/p=%d", a, par), func(b *testing.B) {
				ip, doc := fresh("ip"), fresh("doc")
				ip.Algorithm, doc.Algorithm = a, a
				measure(b, rdb, par, func(i int) error {
					_, err := l.AllowAll(ctx, Check{ip, ids[i%len(ids)]}, Check{doc, ids[(i+1)%len(ids)]})
					return err
				})
			})
		}
		b.Run(fmt.Sprintf("ceiling_return_1/p=%d", par), func(b *testing.B) {
			// The floor of any decision: one script that only returns, through the same client
			// with the same deadline. Every other figure is a fraction of what this machine's
			// round trip allows.
			measure(b, rdb, par, func(i int) error {
				ctx, cancel := context.WithTimeout(ctx, time.Second)
				defer cancel()
				return returnOne.Run(ctx, rdb, nil).Err()
			})
		})
		b.Run(fmt.Sprintf("redis_rate_gcra/one_key/p=%d", par), func(b *testing.B) {
			limit := redis_rate.PerMinute(1000)
			prefix := fresh("peer").Name + ":"
			measure(b, rdb, par, func(i int) error {
				// The same budget as ours: a limiter without a deadline can hang a request.
				ctx, cancel := context.WithTimeout(ctx, time.Second)
				defer cancel()
				_, err := peer.Allow(ctx, prefix+ids[i%len(ids)], limit)
				return err
			})
		})
	}
}

// measure calls fn b.N times from par goroutines and reports decisions per second and the Redis CPU
// time per decision (EVALSHA's time from INFO commandstats, over the decisions made): the figure that bounds a
// fleet's throughput on one Redis, and one far steadier than wall time on a shared machine.
func measure(b *testing.B, rdb *redis.Client, par int, fn func(i int) error) {
	b.Helper()
	ctx := context.Background()
	if rdb != nil {
		if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
			b.Fatal(err)
		}
	}
	var next atomic.Int64
	var failed atomic.Pointer[error]
	var wg sync.WaitGroup
	redisCPU := func() float64 { return 0 }
	if rdb != nil {
		redisCPU = func() float64 { return redisCPUSeconds(b, rdb) }
	}
	redisBefore, clientBefore := redisCPU(), processCPUSeconds()
	b.ReportAllocs()
	b.ResetTimer()
	for range par {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				if err := fn(int(i)); err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	if err := failed.Load(); err != nil {
		b.Fatal(*err)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
	// CPU per decision, whole processes: this one (the client and the limiter) and redis-server
	// (the scripts, and its network work, which EVALSHA's time leaves out). On two shared cores
	// these bound the throughput, where wall time only says who waited.
	b.ReportMetric((processCPUSeconds()-clientBefore)*1e6/float64(b.N), "client-cpu-µs/op")
	if rdb == nil {
		return // a cluster: each node keeps its own statistics
	}
	b.ReportMetric((redisCPU()-redisBefore)*1e6/float64(b.N), "redis-cpu-µs/op")
	// Redis's time in scripts per decision: EVALSHA's total over the decisions made (a batch is
	// one call for several). And the decisions per call: how large the batches grew.
	if calls, usec := evalshaStats(b, rdb); calls > 0 {
		b.ReportMetric(float64(b.N)/calls, "decisions/call")
		b.ReportMetric(usec/float64(b.N), "redis-µs/op")
	}
}

// evalshaStats are Redis's EVALSHA calls so far and its time in them, µs (INFO commandstats):
// zero before the first.
func evalshaStats(b *testing.B, rdb *redis.Client) (calls, usec float64) {
	b.Helper()
	stats, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	_, rest, found := strings.Cut(stats, "cmdstat_evalsha:")
	if !found {
		return 0, 0
	}
	for _, field := range strings.Split(strings.SplitN(rest, "\r\n", 2)[0], ",") {
		k, v, _ := strings.Cut(field, "=")
		f, _ := strconv.ParseFloat(v, 64)
		switch k {
		case "calls":
			calls = f
		case "usec":
			usec = f
		}
	}
	return calls, usec
}

// BenchmarkCluster compares decisions on a 3-master Redis Cluster with decisions on one node,
// in the same run: one key, and the login's two keys (one script on one node; on the cluster,
// one script per slot, concurrently, with withdrawals when one refuses).
//
//	go test -run '^$' -bench Cluster -benchtime 3s ./internal/ratelimit
func BenchmarkCluster(b *testing.B) {
	single := redistest.Start(b).Client(func(o *redis.Options) { ClientOptions(o, time.Second); o.PoolSize = 32 })
	c := redistest.StartCluster(b, 3, 0)
	cluster := c.Client(func(o *redis.ClusterOptions) {
		o.ContextTimeoutEnabled, o.MaxRetries, o.PoolSize = true, -1, 32
	})
	ids := make([]string, 10_000)
	for i := range ids {
		ids[i] = "user-" + strconv.Itoa(i)
	}
	ctx := context.Background()
	var round atomic.Int64
	fresh := func(name string) Policy {
		return Policy{Name: fmt.Sprint(name, "-", round.Add(1)), Limit: 1000, Window: time.Minute}
	}
	for _, target := range []struct {
		name  string
		rdb   redis.Scripter
		stats *redis.Client
	}{{"single", single, single}, {"cluster", cluster, nil}} {
		l, err := New(target.rdb, Options{KeySecret: benchSecret, Timeout: time.Second})
		if err != nil {
			b.Fatal(err)
		}
		b.Run(target.name+"/one_key/p=16", func(b *testing.B) {
			p := fresh("one")
			measure(b, target.stats, 16, func(i int) error {
				_, err := l.AllowAll(ctx, Check{Policy: p, Identity: ids[i%len(ids)]})
				return err
			})
		})
		b.Run(target.name+"/two_keys/p=16", func(b *testing.B) {
			ip, doc := fresh("ip"), fresh("doc")
			measure(b, target.stats, 16, func(i int) error {
				_, err := l.AllowAll(ctx, Check{ip, ids[i%len(ids)]}, Check{doc, ids[(i+1)%len(ids)]})
				return err
			})
		})
	}
}

// processCPUSeconds is this process's user and system CPU time so far.
func processCPUSeconds() float64 {
	var u syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &u)
	return time.Duration(u.Utime.Nano() + u.Stime.Nano()).Seconds()
}

// redisCPUSeconds is redis-server's user and system CPU time so far (INFO cpu).
func redisCPUSeconds(b *testing.B, rdb *redis.Client) float64 {
	b.Helper()
	info, err := rdb.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	total := 0.0
	for _, field := range []string{"used_cpu_sys:", "used_cpu_user:"} {
		if _, rest, ok := strings.Cut(info, "\r\n"+field); ok {
			v, _, _ := strings.Cut(rest, "\r\n")
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatal(err)
			}
			total += f
		}
	}
	return total
}

// benchSetup is a private redis-server's client, a Limiter on it that batches as a replica does,
// the peer (redis_rate) on the same client, and 10,000 identities to take in turn.
func benchSetup(b *testing.B) (*redis.Client, *Limiter, *redis_rate.Limiter, []string) {
	b.Helper()
	srv := redistest.Start(b)
	rdb := srv.Client(func(o *redis.Options) { ClientOptions(o, time.Second); o.PoolSize = 32 })
	l, err := New(rdb, Options{KeySecret: benchSecret, Timeout: time.Second, Runner: batch.New(rdb, Scripts(rdb), 32)})
	if err != nil {
		b.Fatal(err)
	}
	ids := make([]string, 10_000)
	for i := range ids {
		ids[i] = "user-" + strconv.Itoa(i)
	}
	return rdb, l, redis_rate.NewLimiter(rdb), ids
}

// benchSecret keys the benchmarks' Limiters.
var benchSecret = []byte("0123456789abcdef-benchmarks")

// returnOne is the cheapest script there is: the floor of any decision.
var returnOne = redis.NewScript("return 1")
