package pixlimit_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/pixlimit/pixlimit/internal/auth"
	"github.com/pixlimit/pixlimit/internal/pix"
	"github.com/pixlimit/pixlimit/internal/testing/apitest"
	"github.com/pixlimit/pixlimit/internal/testing/redistest"
)

// BenchmarkFlood is the attack the demo tells, at full speed, against two replicas on loopback
// over a real redis-server: attackers flood POST /v1/login for one CPF from rotating IPs and
// POST /v1/pix from one account, while legitimate users log in, read statements and pay at a
// normal pace. It runs twice in one process, with the deny cache and the circuit breaker off,
// then on, each time through three phases: quiet (legitimate users only), flood, and flood with
// Redis frozen (SIGSTOP) in its middle. It prints the table docs/benchmarks-history.md keeps:
//
//	go test -run '^$' -bench '^BenchmarkFlood$' -benchtime 1x .
//
// The machine is shared by the attackers, the replicas and Redis, so the attackers' own CPU
// weighs on everyone's latency: the figures compare the two configurations, not a production box.
func BenchmarkFlood(b *testing.B) {
	srv := redistest.Start(b)
	var rows []floodResult
	for range b.N {
		for _, on := range []bool{false, true} {
			rows = append(rows, runFlood(b, srv, on))
		}
	}
	printFlood(os.Stdout, rows)
}

const (
	floodLegitUsers = 40
	floodQuiet      = 3 * time.Second
	floodPhase      = 5 * time.Second
	floodStall      = 2 * time.Second // Redis frozen in the middle of the stall phase
	floodAttackers  = 8               // goroutines per attack (login, PIX)
)

// floodResult is one configuration's figures.
type floodResult struct {
	cacheOn                   bool
	refusedPerSecPerReplica   float64
	scriptCallsPerRefusal     float64
	legitQuietP50, legitQuiet time.Duration // p99
	legitFloodP50, legitFlood time.Duration // p99
	legitSuccess              float64       // share of legitimate requests answered 2xx during the flood
	failModeP50, failModeP99  time.Duration // in the second half of the stall
	failModeAnswers           int
}

func runFlood(b *testing.B, srv *redistest.Server, on bool) floodResult {
	b.Helper()
	ledger, users := floodLedger(b)
	env := map[string]string{"TRUSTED_PROXIES": "127.0.0.1/32", "REDIS_TIMEOUT": "100ms", "LOG_LEVEL": "error"}
	if !on {
		env["RATELIMIT_DENY_CACHE_SIZE"], env["RATELIMIT_BREAKER_FAILURES"] = "0", "0"
	}
	replicas, tokens := fleet(b, srv, ledger, 2, env)
	bases := []string{replicas[0].Base, replicas[1].Base}
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 256, MaxConnsPerHost: 256}}
	defer client.CloseIdleConnections()
	attacker, _ := tokens.Issue(auth.Subject{Account: "acct-ana", Payer: "payer-ana", Person: "PF"})

	res := floodResult{cacheOn: on}
	stallWindow := &window{}
	quiet := legit(client, bases, users, floodQuiet, stallWindow)
	res.legitQuietP50, res.legitQuiet = quiet.percentile(50), quiet.percentile(99)

	before := scriptCalls(b, srv)
	stop := make(chan struct{})
	attack := attackers(client, bases, attacker, stop, stallWindow)
	flood := legit(client, bases, users, floodPhase, stallWindow)
	close(stop)
	refused := attack.wait()
	res.refusedPerSecPerReplica = float64(refused) / floodPhase.Seconds() / float64(len(bases))
	res.scriptCallsPerRefusal = float64(scriptCalls(b, srv)-before) / float64(max(refused, 1))
	res.legitFloodP50, res.legitFlood = flood.percentile(50), flood.percentile(99)
	res.legitSuccess = float64(flood.ok) / float64(max(flood.total, 1))

	stop = make(chan struct{})
	attack = attackers(client, bases, attacker, stop, stallWindow)
	stalled := make(chan struct{})
	go func() { // freeze Redis in the middle of the phase
		defer close(stalled)
		time.Sleep((floodPhase - floodStall) / 2)
		srv.Pause()
		now := time.Now()
		stallWindow.from.Store(now.Add(floodStall / 2).UnixNano())
		stallWindow.to.Store(now.Add(floodStall).UnixNano())
		time.Sleep(floodStall)
		srv.Resume()
		stallWindow.from.Store(0)
	}()
	stall := legit(client, bases, users, floodPhase, stallWindow)
	<-stalled
	close(stop)
	attack.wait()
	all := append(stall.failMode, attack.failMode...)
	res.failModeAnswers = len(all)
	res.failModeP50, res.failModeP99 = percentile(all, 50), percentile(all, 99)
	return res
}

// floodLedger is the demo accounts plus the legitimate users, who share one cheap bcrypt hash.
func floodLedger(b *testing.B) (*pix.MemoryLedger, []pix.Account) {
	hash, err := bcrypt.GenerateFromPassword([]byte("legit-password"), bcrypt.MinCost)
	if err != nil {
		b.Fatal(err)
	}
	var users []pix.Account
	for i := range floodLegitUsers {
		users = append(users, pix.Account{ID: fmt.Sprintf("acct-user-%d", i), Name: fmt.Sprintf("User %d", i),
			Document: apitest.CPF(2000 + i), PasswordHash: hash, Keys: []string{fmt.Sprintf("user%d@example.com", i)},
			OpeningCents: 1_000_000})
	}
	ledger, err := pix.NewMemoryLedger(append(apitest.DemoAccounts(b), users...))
	if err != nil {
		b.Fatal(err)
	}
	return ledger, users
}

// observed collects latencies of successful requests and of fail-mode answers.
type observed struct {
	stall     *window
	mu        sync.Mutex
	latencies []time.Duration
	failMode  []time.Duration
	ok, total int
}

// window bounds when fail-mode answers are counted: the second half of the stall, once a breaker
// has had time to open (unix nanoseconds; zero outside the stall phase).
type window struct{ from, to atomic.Int64 }

func (w *window) contains(t time.Time) bool {
	from, to := w.from.Load(), w.to.Load()
	return from != 0 && t.UnixNano() >= from && t.UnixNano() <= to
}

func (o *observed) record(status int, header http.Header, body []byte, took time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.total++
	switch {
	case !o.stall.contains(time.Now().Add(-took)):
	case status == http.StatusTooManyRequests && bytes.Contains(body, []byte("rate_limiter_unavailable")),
		status == http.StatusOK && header.Get("RateLimit-Limit") == "" && header.Get("Content-Type") != "":
		o.failMode = append(o.failMode, took)
	}
	if status >= 200 && status < 300 {
		o.ok++
		o.latencies = append(o.latencies, took)
	}
}

func (o *observed) percentile(p float64) time.Duration { return percentile(o.latencies, p) }

func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	ds = slices.Clone(ds)
	slices.Sort(ds)
	return ds[min(len(ds)-1, int(float64(len(ds))*p/100))]
}

// send posts or gets one request, records it and returns its status and body; it never fails
// the benchmark.
func send(client *http.Client, o *observed, method, url, token, ip string, body any) (int, []byte) {
	var rd io.Reader
	if body != nil {
		buf, _ := json.Marshal(body)
		rd = bytes.NewReader(buf)
	}
	req, _ := http.NewRequest(method, url, rd)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Forwarded-For", ip)
	if strings.HasSuffix(url, "/v1/pix") {
		req.Header.Set("Idempotency-Key", apitest.NewIdempotencyKey())
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		o.record(0, nil, nil, time.Since(start))
		return 0, nil
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	o.record(resp.StatusCode, resp.Header, b, time.Since(start))
	return resp.StatusCode, b
}

// legit runs the legitimate users for d: each logs in from its own address, then reads its
// statement every second and pays 1 cent every 5 s, on a replica in turn.
func legit(client *http.Client, bases []string, users []pix.Account, d time.Duration, stall *window) *observed {
	o := &observed{stall: stall}
	start := time.Now()
	var wg sync.WaitGroup
	for i, u := range users {
		wg.Go(func() {
			ip := fmt.Sprintf("192.0.2.%d", 10+i)
			base := func(n int) string { return bases[(i+n)%len(bases)] }
			time.Sleep(time.Duration(rand.IntN(1000)) * time.Millisecond) // spread the users over a second
			_, body := send(client, o, "POST", base(0)+"/v1/login", "", ip, map[string]string{"document": u.Document, "password": "legit-password"})
			var login struct {
				AccessToken string `json:"access_token"`
			}
			_ = json.Unmarshal(body, &login)
			for n := 1; time.Since(start) < d; n++ {
				if n%5 == 0 {
					send(client, o, "POST", base(n)+"/v1/pix", login.AccessToken, ip, map[string]any{"key": users[(i+1)%len(users)].Keys[0], "amount_cents": 1})
				} else {
					send(client, o, "GET", base(n)+"/v1/statement?limit=1", login.AccessToken, ip, nil)
				}
				time.Sleep(time.Second)
			}
		})
	}
	wg.Wait()
	return o
}

// attack is the attackers at work until stop closes.
type attack struct {
	wg      sync.WaitGroup
	refused atomic.Int64
	*observed
}

func (a *attack) wait() int64 { a.wg.Wait(); return a.refused.Load() }

// attackers floods the login for Carla's document from rotating addresses and PIX from one
// account, as fast as floodAttackers goroutines each can, alternating replicas.
func attackers(client *http.Client, bases []string, token string, stop <-chan struct{}, stall *window) *attack {
	a := &attack{observed: &observed{stall: stall}}
	for g := range 2 * floodAttackers {
		a.wg.Go(func() {
			o := &observed{stall: stall}
			for n := 0; ; n++ {
				select {
				case <-stop:
					a.mu.Lock()
					a.failMode = append(a.failMode, o.failMode...)
					a.mu.Unlock()
					return
				default:
				}
				ip := "203.0.113." + strconv.Itoa(1+(g*7919+n)%250)
				var status int
				var body []byte
				if g%2 == 0 {
					status, body = send(client, o, "POST", bases[n%len(bases)]+"/v1/login", "", ip,
						map[string]string{"document": "111.444.777-35", "password": "guess"})
				} else {
					status, body = send(client, o, "POST", bases[n%len(bases)]+"/v1/pix", token, ip,
						map[string]any{"key": "bruno@example.com", "amount_cents": 1})
				}
				if status == http.StatusTooManyRequests && bytes.Contains(body, []byte("rate_limit_exceeded")) {
					a.refused.Add(1)
				}
			}
		})
	}
	return a
}

// scriptCalls is how many scripts Redis has run (EVALSHA and EVAL), from INFO commandstats.
func scriptCalls(b *testing.B, srv *redistest.Server) int64 {
	rdb := srv.Client(nil)
	defer rdb.Close()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total int64
	for _, line := range strings.Split(info, "\n") {
		if strings.HasPrefix(line, "cmdstat_evalsha:") || strings.HasPrefix(line, "cmdstat_eval:") {
			calls, _, _ := strings.Cut(strings.TrimPrefix(line[strings.Index(line, ":")+1:], "calls="), ",")
			n, _ := strconv.ParseInt(calls, 10, 64)
			total += n
		}
	}
	return total
}

func printFlood(w io.Writer, rows []floodResult) {
	fmt.Fprintf(w, "\n%d legitimate users; %d login + %d PIX attacker goroutines; 2 replicas; phases of %v (quiet %v)\n",
		floodLegitUsers, floodAttackers, floodAttackers, floodPhase, floodQuiet)
	fmt.Fprintf(w, "| cache and breaker | refused/s per replica | script calls per refusal | legit p50 / p99 quiet | legit p50 / p99 flood | legit 2xx in flood | fail-mode p50 / p99, 2nd half of a %v stall (answers) |\n", floodStall)
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|")
	for _, r := range rows {
		state := "off"
		if r.cacheOn {
			state = "on"
		}
		fmt.Fprintf(w, "| %s | %.0f | %.4f | %v / %v | %v / %v | %.1f%% | %v / %v (%d) |\n", state, r.refusedPerSecPerReplica, r.scriptCallsPerRefusal,
			r.legitQuietP50.Round(10*time.Microsecond), r.legitQuiet.Round(10*time.Microsecond),
			r.legitFloodP50.Round(10*time.Microsecond), r.legitFlood.Round(10*time.Microsecond), 100*r.legitSuccess,
			r.failModeP50.Round(10*time.Microsecond), r.failModeP99.Round(10*time.Microsecond), r.failModeAnswers)
	}
}
