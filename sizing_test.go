package pixlimit_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pixlimit/pixlimit/internal/config"
	"github.com/pixlimit/pixlimit/internal/dict"
	"github.com/pixlimit/pixlimit/internal/ratelimit"
	"github.com/pixlimit/pixlimit/internal/ratelimit/batch"
	"github.com/pixlimit/pixlimit/internal/ratelimit/sequence"
	"github.com/pixlimit/pixlimit/internal/ratelimit/slots"
	"github.com/pixlimit/pixlimit/internal/testing/redistest"
)

// BenchmarkSizing measures what Redis holds for customers active within their windows, filled by
// the replicas' own scripts (the Limiter's calls a replica makes, with the default policies, their
// windows lengthened to an hour so nothing expires while the fill runs), on a redis-server of its
// own: a customer's typical visit (a login, a key look-up, a PIX to that key with its slot, mark
// and voucher, a statement) and one at every limit (10 PIX, 30 statements, 5 logins of its
// document and 10 of its IP, its look-up bucket spent). It reports Redis's used_memory per
// customer and per key, and the decisions each Redis CPU second made while filling. Its size is
// PIXLIMIT_SIZING_CUSTOMERS (default 10,000; docs/operating.md's figures are of 100,000):
//
//	PIXLIMIT_SIZING_CUSTOMERS=100000 go test -run '^$' -bench Sizing -benchtime 1x -timeout 30m .
func BenchmarkSizing(b *testing.B) {
	n := 10_000
	if v, err := strconv.Atoi(os.Getenv("PIXLIMIT_SIZING_CUSTOMERS")); err == nil && v > 0 {
		n = v
	}
	cfg, err := config.Load(config.Map(map[string]string{"AUTH_SECRET": rand.Text() + rand.Text()}))
	if err != nil {
		b.Fatal(err)
	}
	long := func(p ratelimit.Policy) ratelimit.Policy { p.Window = time.Hour; return p }
	lim := cfg.Limits
	pixP, stmtP, ipP, docP := long(lim.PIX.Policy), long(lim.Statement.Policy), long(lim.LoginIP.Policy), long(lim.LoginAccount.Policy)
	bucketP, bankP := long(lim.PIXLookup.Policy), long(lim.LookupParticipant.Policy)
	slotP := lim.PIXConcurrency.Policy
	inflight := slots.Slots{Name: slotP.Name, Count: slotP.Limit, Lease: time.Hour}
	vouchers := dict.Vouchers
	vouchers.Lifetime = time.Hour
	marks := slots.Slots{Name: "pix-original", Count: 1, Lease: time.Hour}

	srv := redistest.Start(b)
	rdb := srv.Client(func(o *redis.Options) { ratelimit.ClientOptions(o, 10*time.Second); o.PoolSize = 32 })
	l, err := ratelimit.New(rdb, ratelimit.Options{KeySecret: []byte(rand.Text() + rand.Text()), Timeout: 10 * time.Second,
		Runner: batch.New(rdb, ratelimit.Scripts(rdb), 32), Sequences: sequence.New(rdb)})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	bank := ratelimit.Check{Policy: bankP, Identity: dict.ParticipantIdentity}
	visit := func(i int) (decisions int, err error) {
		ip, doc, acct := fmt.Sprintf("ip-%d", i), fmt.Sprintf("doc-%d", i), fmt.Sprintf("acct-%d", i)
		payer := ratelimit.Check{Policy: bucketP, Identity: doc}
		voucher, mark := doc+"|key", acct+":idem"
		holder := slots.Holder("idem")
		calls := [][]ratelimit.Step{
			{ratelimit.AllowStep(ratelimit.Check{Policy: ipP, Identity: ip}, ratelimit.Check{Policy: docP, Identity: doc})}, // the login
			{ratelimit.AskStep(payer, bank)}, // the look-up: asked, then paid and granted
			{ratelimit.ChargeStep(payer, 1), ratelimit.ChargeStep(bank, 1), vouchers.Grant(voucher)},
			{ratelimit.AskStep(payer, bank), inflight.Ask(acct, holder), ratelimit.AllowStep(ratelimit.Check{Policy: pixP, Identity: acct}),
				inflight.Hold(acct, holder), marks.Hold(mark, "original")}, // the PIX's admission
			{vouchers.Redeem(voucher), ratelimit.RefundStep(1, payer, bank), inflight.Release(acct, holder), marks.Release(mark, "original")},
			{ratelimit.AllowStep(ratelimit.Check{Policy: stmtP, Identity: acct})}, // the statement
		}
		for _, steps := range calls {
			if _, err := l.Decide(ctx, steps...); err != nil {
				return decisions, err
			}
			decisions++
		}
		return decisions, nil
	}
	atLimits := func(i int) (decisions int, err error) {
		ip, doc, acct := fmt.Sprintf("full-ip-%d", i), fmt.Sprintf("full-doc-%d", i), fmt.Sprintf("full-acct-%d", i)
		for _, c := range []struct {
			check ratelimit.Check
			times int
		}{
			{ratelimit.Check{Policy: ipP, Identity: ip}, ipP.Limit}, {ratelimit.Check{Policy: docP, Identity: doc}, docP.Limit},
			{ratelimit.Check{Policy: pixP, Identity: acct}, pixP.Limit}, {ratelimit.Check{Policy: stmtP, Identity: acct}, stmtP.Limit},
		} {
			for range c.times {
				if _, err := l.AllowAll(ctx, c.check); err != nil {
					return decisions, err
				}
				decisions++
			}
		}
		_, err = l.Decide(ctx, ratelimit.ChargeStep(ratelimit.Check{Policy: bucketP, Identity: doc}, bucketP.Capacity()))
		return decisions + 1, err
	}
	for _, tc := range []struct {
		name string
		fill func(i int) (int, error)
	}{{"typical_visit", visit}, {"at_every_limit", atLimits}} {
		b.Run(tc.name, func(b *testing.B) {
			if err := rdb.FlushAll(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			memBefore, cpuBefore := sizingInfo(b, rdb, "used_memory:"), sizingInfo(b, rdb, "used_cpu_sys:")+sizingInfo(b, rdb, "used_cpu_user:")
			var next, decisions atomic.Int64
			var wg sync.WaitGroup
			var failed atomic.Pointer[error]
			start := time.Now()
			for range 16 {
				wg.Go(func() {
					for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
						d, err := tc.fill(i)
						decisions.Add(int64(d))
						if err != nil {
							failed.CompareAndSwap(nil, &err)
							return
						}
					}
				})
			}
			wg.Wait()
			took := time.Since(start)
			if err := failed.Load(); err != nil {
				b.Fatal(*err)
			}
			memAfter, cpuAfter := sizingInfo(b, rdb, "used_memory:"), sizingInfo(b, rdb, "used_cpu_sys:")+sizingInfo(b, rdb, "used_cpu_user:")
			keys, err := rdb.DBSize(ctx).Result()
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(n), "customers")
			b.ReportMetric((memAfter-memBefore)/float64(n), "bytes/customer")
			b.ReportMetric(float64(keys)/float64(n), "keys/customer")
			b.ReportMetric((memAfter-memBefore)/float64(keys), "bytes/key")
			b.ReportMetric(float64(decisions.Load())/(cpuAfter-cpuBefore), "decisions/redis-cpu-s")
			b.ReportMetric(float64(decisions.Load())/took.Seconds(), "decisions/s")
		})
	}
}

// sizingInfo is the number after field in Redis's INFO.
func sizingInfo(b *testing.B, rdb *redis.Client, field string) float64 {
	b.Helper()
	info, err := rdb.Info(context.Background()).Result()
	if err != nil {
		b.Fatal(err)
	}
	_, rest, ok := strings.Cut(info, "\r\n"+field)
	if !ok {
		b.Fatalf("INFO has no %s", field)
	}
	v, _, _ := strings.Cut(rest, "\r\n")
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		b.Fatal(err)
	}
	return f
}
