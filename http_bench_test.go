package pixlimit_test

import (
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pixlimit/pixlimit/internal/auth"
	"github.com/pixlimit/pixlimit/internal/pix"
	"github.com/pixlimit/pixlimit/internal/testing/redistest"
)

// BenchmarkStatementOverHTTP: two replicas over one redis-server, 64 concurrent clients reading
// 1,000 accounts' statements over loopback HTTP, with the limiter's batching on (the default)
// and off (RATELIMIT_BATCH_MAX=1), in one run. Every request is decided by the limiter (the limit
// is high, so nearly all admit) and read from the in-memory ledger.
//
//	go test -run '^$' -bench StatementOverHTTP -benchtime 20000x -count 3 .
func BenchmarkStatementOverHTTP(b *testing.B) {
	srv := redistest.Start(b)
	accounts := make([]pix.Account, 1000)
	for i := range accounts {
		accounts[i] = pix.Account{ID: fmt.Sprint("acct-", i), Name: "Bench", Document: fmt.Sprintf("%011d", i), OpeningCents: 1}
	}
	ledger, err := pix.NewMemoryLedger(accounts)
	if err != nil {
		b.Fatal(err)
	}
	for _, batch := range []string{"32", "1"} {
		b.Run("batch_max="+batch, func(b *testing.B) {
			replicas, tokens := fleet(b, srv, ledger, 2, map[string]string{"RATELIMIT_BATCH_MAX": batch,
				"STATEMENT_LIMIT": "1000000", "LOG_LEVEL": "error", "REDIS_TIMEOUT": "1s"})
			bearer := make([]string, len(accounts))
			for i, a := range accounts {
				tok, err := tokens.Issue(auth.Subject{Account: a.ID, Payer: a.ID, Person: "PF"})
				if err != nil {
					b.Fatal(err)
				}
				bearer[i] = "Bearer " + tok
			}
			client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 128}}
			defer client.CloseIdleConnections()
			var next, failed atomic.Int64
			var wg sync.WaitGroup
			b.ResetTimer()
			for range 64 {
				wg.Go(func() {
					for {
						i := next.Add(1) - 1
						if i >= int64(b.N) {
							return
						}
						req, _ := http.NewRequest(http.MethodGet, replicas[i%2].Base+"/v1/statement?limit=1", nil)
						req.Header.Set("Authorization", bearer[i%int64(len(bearer))])
						resp, err := client.Do(req)
						if err != nil || resp.StatusCode != http.StatusOK {
							failed.Add(1)
						}
						if err == nil {
							resp.Body.Close()
						}
					}
				})
			}
			wg.Wait()
			b.StopTimer()
			if n := failed.Load(); n > 0 {
				b.Fatalf("%d of %d requests failed", n, b.N)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "requests/s")
		})
	}
}
