package ratelimit_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"

	. "github.com/pixlimit/pixlimit/internal/ratelimit"
)

// BenchmarkVersus compares one key's batched sliding log (and its packed form) with
// go-redis/redis_rate (GCRA) so that the machine's drift cannot land on one side: in each of 30
// rounds both decide the same number of requests, one after the other, the order alternating
// (ours first in even rounds, the peer's in odd ones), on the same client and redis-server as
// BenchmarkDecision's. Each round gives a ratio, ours/peer's decisions per second; the benchmark
// reports their median and the lowest and highest, so a claim holds in every round or is not
// made. Run it once (-benchtime 1x: b.N is not used).
//
//	go test -run '^$' -bench Versus -benchtime 1x ./internal/ratelimit
func BenchmarkVersus(b *testing.B) {
	_, l, peer, ids := benchSetup(b)
	ctx := context.Background()
	const rounds = 30
	for _, a := range []Algorithm{SlidingLog, SlidingLogPacked} {
		for _, par := range []int{1, 16, 64} {
			b.Run(fmt.Sprintf("%s/p=%d", a, par), func(b *testing.B) {
				slice := 1000 * min(par, 8) // a slice lasts about a tenth of a second at either side's pace
				ours := Policy{Name: fmt.Sprint("versus-", a, par), Limit: 1000, Window: time.Minute, Algorithm: a}
				limit, prefix := redis_rate.PerMinute(1000), fmt.Sprint("versus-peer-", a, par, ":")
				run := map[bool]func(i int) error{
					true: func(i int) error {
						_, err := l.AllowAll(ctx, Check{Policy: ours, Identity: ids[i%len(ids)]})
						return err
					},
					false: func(i int) error {
						ctx, cancel := context.WithTimeout(ctx, time.Second) // the budget ours has
						defer cancel()
						_, err := peer.Allow(ctx, prefix+ids[i%len(ids)], limit)
						return err
					},
				}
				var ratios []float64
				for r := range rounds {
					var rate [2]float64 // ours, the peer's
					for _, isOurs := range []bool{r%2 == 0, r%2 != 0} {
						got, err := paced(par, slice, run[isOurs])
						if err != nil {
							b.Fatal(err)
						}
						rate[map[bool]int{true: 0, false: 1}[isOurs]] = got
					}
					ratios = append(ratios, rate[0]/rate[1])
				}
				slices.Sort(ratios)
				b.ReportMetric(ratios[len(ratios)/2], "median-ratio")
				b.ReportMetric(ratios[0], "lowest-ratio")
				b.ReportMetric(ratios[len(ratios)-1], "highest-ratio")
			})
		}
	}
}

// paced runs fn n times from par goroutines and returns the calls per second.
func paced(par, n int, fn func(i int) error) (float64, error) {
	var next atomic.Int64
	var failed atomic.Pointer[error]
	var wg sync.WaitGroup
	start := time.Now()
	for range par {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < int64(n); i = next.Add(1) - 1 {
				if err := fn(int(i)); err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := failed.Load(); err != nil {
		return 0, *err
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// BenchmarkTwoKeys compares a login's decision (two keys, IP and document, in one script) with a
// one-key decision, the fair way BenchmarkVersus compares ours with the peer: in each of 30
// rounds both decide the same number of requests at p=16, batched, one after the other, the
// order alternating, and each slice's Redis time per decision is read from EVALSHA's total in
// INFO commandstats. Each round gives a ratio, two keys' µs over one key's; the benchmark
// reports their median and the lowest and highest.
//
//	go test -run '^$' -bench TwoKeys -benchtime 1x ./internal/ratelimit
func BenchmarkTwoKeys(b *testing.B) {
	rdb, l, _, ids := benchSetup(b)
	ctx := context.Background()
	const rounds, par, slice = 30, 16, 8000
	for _, a := range []Algorithm{SlidingLog, SlidingLogPacked} {
		b.Run(fmt.Sprintf("%s/p=%d", a, par), func(b *testing.B) {
			one := Policy{Name: fmt.Sprint("one-", a), Limit: 1000, Window: time.Minute, Algorithm: a}
			ip, doc := one, one
			ip.Name, doc.Name = fmt.Sprint("ip-", a), fmt.Sprint("doc-", a)
			run := map[bool]func(i int) error{
				false: func(i int) error {
					_, err := l.AllowAll(ctx, Check{one, ids[i%len(ids)]})
					return err
				},
				true: func(i int) error {
					_, err := l.AllowAll(ctx, Check{ip, ids[i%len(ids)]}, Check{doc, ids[(i+1)%len(ids)]})
					return err
				},
			}
			var ratios []float64
			for r := range rounds {
				var µs [2]float64 // one key's, two keys'
				for _, two := range []bool{r%2 == 0, r%2 != 0} {
					_, before := evalshaStats(b, rdb)
					if _, err := paced(par, slice, run[two]); err != nil {
						b.Fatal(err)
					}
					_, after := evalshaStats(b, rdb)
					µs[map[bool]int{false: 0, true: 1}[two]] = (after - before) / slice
				}
				ratios = append(ratios, µs[1]/µs[0])
			}
			slices.Sort(ratios)
			b.ReportMetric(ratios[len(ratios)/2], "median-ratio")
			b.ReportMetric(ratios[0], "lowest-ratio")
			b.ReportMetric(ratios[len(ratios)-1], "highest-ratio")
		})
	}
}
