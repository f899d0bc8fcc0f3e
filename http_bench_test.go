package pixlimit_test

import (
	"crypto/rand"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pixlimit/pixlimit/internal/auth"
	"github.com/pixlimit/pixlimit/internal/pix"
	"github.com/pixlimit/pixlimit/internal/testing/pgtest"
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
			drive(b, http.StatusOK, func(i int64) *http.Request {
				req, _ := http.NewRequest(http.MethodGet, replicas[i%2].Base+"/v1/statement?limit=1", nil)
				req.Header.Set("Authorization", bearer[i%int64(len(bearer))])
				return req
			})
		})
	}
}

// BenchmarkPIXOverHTTP: two replicas over one redis-server and one PostgreSQL database, 64
// concurrent clients sending PIX of one cent over loopback HTTP from 200 accounts, each to the
// next account's key, so that few transfers wait for the same rows. Every PIX is decided by the
// limiter (its look-up buckets and its pix limit; the limits are high, so all admit), moved by
// the ledger, and its look-up buckets settled.
//
//	go test -run '^$' -bench PIXOverHTTP -benchtime 4000x -count 3 .
func BenchmarkPIXOverHTTP(b *testing.B) {
	srv := redistest.Start(b)
	accounts := make([]pix.Account, 200)
	for i := range accounts {
		accounts[i] = pix.Account{ID: fmt.Sprint("acct-", i), Name: "Bench", Document: fmt.Sprintf("%011d", i),
			OpeningCents: 100_000_000, Keys: []string{fmt.Sprintf("bench%d@example.com", i)}}
	}
	ledger, err := pix.OpenPostgres(b.Context(), pgtest.URL(b), time.Second, accounts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(ledger.Close)
	replicas, tokens := fleet(b, srv, ledger, 2, map[string]string{"PIX_LIMIT": "1000000", "LOG_LEVEL": "error",
		"REDIS_TIMEOUT": "1s", "DB_TIMEOUT": "5s"})
	bearer := make([]string, len(accounts))
	for i, a := range accounts {
		tok, err := tokens.Issue(auth.Subject{Account: a.ID, Payer: a.ID, Person: "PF", Device: "bench"})
		if err != nil {
			b.Fatal(err)
		}
		bearer[i] = "Bearer " + tok
	}
	run := rand.Text()
	drive(b, http.StatusCreated, func(i int64) *http.Request {
		from := i % int64(len(accounts))
		body := fmt.Sprintf(`{"key":"bench%d@example.com","amount_cents":1}`, (from+1)%int64(len(accounts)))
		req, _ := http.NewRequest(http.MethodPost, replicas[i%2].Base+"/v1/pix", strings.NewReader(body))
		req.Header.Set("Authorization", bearer[from])
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", fmt.Sprint(run, "-", i))
		return req
	})
}

// drive sends b.N requests, the i-th made by request, from 64 concurrent clients over loopback
// HTTP, fails b if any is not answered want, and reports requests per second.
func drive(b *testing.B, want int, request func(i int64) *http.Request) {
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 128}} // every client's connection kept: no redials
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
				resp, err := client.Do(request(i))
				if err != nil || resp.StatusCode != want {
					failed.Add(1)
				}
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body) // read to its end: a body left unread closes the connection
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
}
