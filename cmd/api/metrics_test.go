package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pixlimit/pixlimit/internal/testing/apitest"
	"github.com/pixlimit/pixlimit/internal/testing/redistest"
)

// scrape reads the API's /metrics into "name{labels}" → value.
func scrape(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	samples := map[string]float64{}
	for _, line := range strings.Split(string(body), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		samples[line[:i]] = v
	}
	return samples
}

func decisions(m map[string]float64, policy, outcome string) float64 {
	return m[fmt.Sprintf(`pixlimit_ratelimit_decisions_total{outcome=%q,policy=%q}`, outcome, policy)]
}

// TestMetricsCountWhatHappened: 15 PIX at once are 10 allowed and 5 refused, as counters, HTTP
// statuses and ledger calls; a Redis outage is one failed_closed PIX, one decided_local statement
// and redis_up 0; no label carries an identity.
func TestMetricsCountWhatHappened(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	metrics := apitest.FreeAddr(t)
	a := startAPI(t, srv, map[string]string{"METRICS_ADDR": metrics, "REDIS_TIMEOUT": "200ms", "PIX_CONCURRENCY": "0"})
	ana := a.Token(demo[0].Document, demo[0].Password)
	statuses := apitest.Burst([]*apitest.Client{a.Client}, 15, func(c *apitest.Client, _ int) apitest.Response {
		return c.PIX(ana, "bruno@example.com", 100)
	})
	if statuses[201] != 10 || statuses[429] != 5 {
		t.Fatalf("15 PIX at once: %v, want 10 × 201 and 5 × 429", statuses)
	}
	m := scrape(t, metrics)
	if got := decisions(m, "pix", "allowed"); got != 10 {
		t.Errorf("pix allowed = %v, want 10", got)
	}
	if got := decisions(m, "pix", "refused") + decisions(m, "pix", "refused_cached"); got != 5 {
		t.Errorf("pix refused + refused_cached = %v, want 5", got)
	}
	for key, want := range map[string]float64{
		`pixlimit_http_requests_total{method="POST",route="/v1/pix",status="201"}`:     10,
		`pixlimit_http_requests_total{method="POST",route="/v1/pix",status="429"}`:     5,
		`pixlimit_ratelimit_decision_seconds_count{policy="pix"}`:                      15 - decisions(m, "pix", "refused_cached"), // Redis's decisions alone
		`pixlimit_ledger_call_seconds_count{call="transfer",result="ok"}`:              10,
		`pixlimit_ledger_call_seconds_count{call="tier_table",result="ok"}`:            1, // the tier poller's first read: its calls are timed too
		`pixlimit_ratelimit_decisions_total{outcome="allowed",policy="login-ip"}`:      1,
		`pixlimit_ratelimit_decisions_total{outcome="allowed",policy="login-account"}`: 1,
		`pixlimit_ratelimit_redis_up`:                                                  1,
		`pixlimit_ratelimit_withdrawals_lost_total`:                                    0,
	} {
		if _, ok := m[key]; !ok {
			t.Errorf("%s not exported", key)
		}
		if m[key] != want {
			t.Errorf("%s = %v, want %v", key, m[key], want)
		}
	}
	if m["go_goroutines"] == 0 || m["process_resident_memory_bytes"] == 0 {
		t.Error("no Go runtime or process metrics")
	}

	bruno := a.Token(demo[1].Document, demo[1].Password) // Ana's PIX key is known full: it would answer from memory
	srv.Kill()
	if r := a.PIX(bruno, "carla@example.com", 100); r.Status != http.StatusTooManyRequests {
		t.Fatalf("PIX with Redis down: %v, want 429", r)
	}
	if r := a.Statement(ana); r.Status != http.StatusOK {
		t.Fatalf("statement with Redis down: %v, want 200", r)
	}
	m = scrape(t, metrics)
	if got := decisions(m, "pix", "failed_closed"); got != 1 {
		t.Errorf("pix failed_closed = %v, want 1", got)
	}
	for _, bucket := range []string{"pix-lookup", "pix-lookup-participant"} { // the PIX's own limit answered, closed
		if got := decisions(m, bucket, "failed_open"); got != 0 {
			t.Errorf("%s failed_open = %v for a PIX refused closed, want 0", bucket, got)
		}
	}
	if got := decisions(m, "statement", "decided_local"); got != 1 {
		t.Errorf("statement decided_local = %v, want 1", got)
	}
	if got := m["pixlimit_ratelimit_redis_up"]; got != 0 {
		t.Errorf("redis_up = %v with Redis down, want 0", got)
	}
	resp, _ := http.Get("http://" + metrics + "/metrics")
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, identity := range []string{"52998224725", "529.982.247-25", "acct-ana", "127.0.0.1", "ana@example.com"} {
		if strings.Contains(string(body), identity) {
			t.Errorf("/metrics contains the identity %q", identity)
		}
	}
}

// TestMetricsNameTheKeyThatRefused: a login refused by its IP key counts as a refusal of
// login-ip alone; its document's key, which had room, is no refusal of login-account (the
// dashboard's sign of someone guessing that account's password).
func TestMetricsNameTheKeyThatRefused(t *testing.T) {
	t.Parallel()
	metrics := apitest.FreeAddr(t)
	a := startAPI(t, redistest.Start(t), map[string]string{"METRICS_ADDR": metrics, "LOGIN_IP_LIMIT": "3"})
	carla := demo[2]
	var got []int
	for range 4 {
		got = append(got, a.Login(carla.Document, "guess").Status)
	}
	if want := []int{401, 401, 401, 429}; !slices.Equal(got, want) {
		t.Fatalf("4 guesses at Carla's password from one IP, 3 allowed per IP: %v, want %v", got, want)
	}
	m := scrape(t, metrics)
	refused := func(policy string) float64 {
		return decisions(m, policy, "refused") + decisions(m, policy, "refused_cached")
	}
	if ip, doc := refused("login-ip"), refused("login-account"); ip != 1 || doc != 0 {
		t.Errorf("refusals counted: login-ip %v, login-account %v; want 1 and 0 (her document's key had 2 of 5 left)", ip, doc)
	}
	if got := decisions(m, "login-account", "allowed"); got != 3 {
		t.Errorf("login-account allowed = %v, want 3", got)
	}
}

// TestRedisUpSaysWhatRedisIsNow: pixlimit_ratelimit_redis_up is asked when scraped, as /readyz
// asks: a replica no request reaches says 0 while Redis is frozen and 1 once it thaws (it said
// what its last decision found: 1 through an outage no request met, 0 long after one ended).
func TestRedisUpSaysWhatRedisIsNow(t *testing.T) {
	t.Parallel()
	srv, metrics := redistest.Start(t), apitest.FreeAddr(t)
	startAPI(t, srv, map[string]string{"METRICS_ADDR": metrics, "REDIS_TIMEOUT": "200ms"})
	if got := scrape(t, metrics)["pixlimit_ratelimit_redis_up"]; got != 1 {
		t.Fatalf("redis_up = %v with Redis up, want 1", got)
	}
	srv.Pause()
	got := scrape(t, metrics)["pixlimit_ratelimit_redis_up"]
	srv.Resume()
	if got != 0 {
		t.Errorf("redis_up = %v with Redis frozen and no request, want 0", got)
	}
	if got := scrape(t, metrics)["pixlimit_ratelimit_redis_up"]; got != 1 {
		t.Errorf("redis_up = %v once Redis thawed, no request since, want 1", got)
	}
}

// TestShadowMode: with PIX_MODE=shadow and a limit of 2, five PIX are all served, without
// RateLimit headers, and counted as 2 allowed and 3 shadow_refused; the log says so, without
// the account.
func TestShadowMode(t *testing.T) {
	t.Parallel()
	metrics := apitest.FreeAddr(t)
	a := startAPI(t, redistest.Start(t), map[string]string{"METRICS_ADDR": metrics, "PIX_MODE": "shadow", "PIX_LIMIT": "2"})
	ana := a.Token(demo[0].Document, demo[0].Password)
	for i := range 5 {
		r := a.PIX(ana, "bruno@example.com", 100)
		if r.Status != http.StatusCreated || r.Header.Get("RateLimit-Limit") != "" || r.Header.Get("RateLimit-Policy") != "" {
			t.Fatalf("PIX %d in shadow mode: %v %v, want 201 without RateLimit headers", i+1, r, r.Header)
		}
	}
	m := scrape(t, metrics)
	if a, s := decisions(m, "pix", "allowed"), decisions(m, "pix", "shadow_refused"); a != 2 || s != 3 {
		t.Errorf("allowed %v, shadow_refused %v; want 2 and 3", a, s)
	}
	if got := a.Balance(ana); got != 1_000_000-500 {
		t.Errorf("balance %d, want %d: every shadowed PIX is served", got, 1_000_000-500)
	}
	logs := a.logs.String()
	if !strings.Contains(logs, "shadow limit would have refused") || strings.Contains(logs, "acct-ana") {
		t.Errorf("the log should report the shadow refusal, without the account:\n%s", logs)
	}
}

// TestTheDashboardQueriesWhatTheAPIExports parses the Grafana dashboard and checks that every
// pixlimit metric its panels query is one a live API exports (a _bucket, a histogram's), every
// label they group by one its samples carry, and every decision outcome they select one its help
// lists (refused_cached since wave 5, no longer refused_local), so the two cannot drift apart.
// The observability compose file must scrape the metrics port the API listens on by default.
func TestTheDashboardQueriesWhatTheAPIExports(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(repo("deploy/grafana/dashboards/pixlimit.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("dashboard: %v", err)
	}
	metrics := apitest.FreeAddr(t)
	a := startAPI(t, redistest.Start(t), map[string]string{"METRICS_ADDR": metrics})
	tok := a.Token(demo[0].Document, demo[0].Password) // some traffic, so every family has samples
	a.PIX(tok, "bruno@example.com", 1)
	a.Statement(tok)
	resp, err := http.Get("http://" + metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	exported := map[string]string{}        // family: its type
	labels := map[string]map[string]bool{} // family: the labels of its samples
	sampleLabel := regexp.MustCompile(`(\w+)="`)
	var outcomes []string
	for _, line := range strings.Split(string(body), "\n") {
		if f := strings.Fields(line); len(f) == 4 && f[1] == "TYPE" {
			exported[f[2]] = f[3]
		}
		if series, set, ok := strings.Cut(line, "{"); ok && !strings.HasPrefix(line, "#") {
			family := histogramFamily(series, exported)
			if labels[family] == nil {
				labels[family] = map[string]bool{}
			}
			set, _, _ = strings.Cut(set, "}")
			for _, m := range sampleLabel.FindAllStringSubmatch(set, -1) {
				labels[family][m[1]] = true
			}
		}
		if help, ok := strings.CutPrefix(line, "# HELP pixlimit_ratelimit_decisions_total "); ok {
			_, list, _ := strings.Cut(help, "(")
			list, _, _ = strings.Cut(list, ")")
			outcomes = strings.Split(list, ", ")
		}
	}
	selected := regexp.MustCompile(`outcome=~?"([^"]+)"`)
	name := regexp.MustCompile(`pixlimit_[a-z_]+`)
	grouped := regexp.MustCompile(`by\s*\(([^)]*)\)`)
	queried := 0
	for _, p := range dash.Panels {
		for _, target := range p.Targets {
			var families []string
			for _, m := range name.FindAllString(target.Expr, -1) {
				queried++
				family := histogramFamily(m, exported)
				if exported[family] == "" {
					t.Errorf("panel %q queries %s, which the API does not export", p.Title, m)
				}
				if family != m && exported[family] != "histogram" {
					t.Errorf("panel %q queries %s, but %s is a %s, not a histogram", p.Title, m, family, exported[family])
				}
				families = append(families, family)
			}
			// Each label it groups by is one its metrics' samples carry (le: a histogram's
			// buckets; instance and job: Prometheus's own).
			for _, by := range grouped.FindAllStringSubmatch(target.Expr, -1) {
				for _, l := range strings.Split(by[1], ",") {
					l = strings.TrimSpace(l)
					for _, f := range families {
						if l != "instance" && l != "job" && !labels[f][l] {
							t.Errorf("panel %q groups %s by %q, a label its samples do not carry", p.Title, f, l)
						}
					}
				}
			}
			for _, sel := range selected.FindAllStringSubmatch(target.Expr, -1) {
				for _, alt := range strings.Split(sel[1], "|") {
					re := regexp.MustCompile("^(?:" + alt + ")$")
					if !slices.ContainsFunc(outcomes, re.MatchString) {
						t.Errorf("panel %q selects the outcome %q, which is none of the API's %v", p.Title, alt, outcomes)
					}
				}
			}
		}
	}
	if len(dash.Panels) < 6 || queried < 8 {
		t.Errorf("%d panels querying %d metrics: the dashboard lost its panels", len(dash.Panels), queried)
	}
	scrape, err := os.ReadFile(repo("deploy/prometheus.yml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, target := range []string{"api-1:9464", "api-2:9464"} {
		if !strings.Contains(string(scrape), target) {
			t.Errorf("deploy/prometheus.yml does not scrape %s (METRICS_ADDR's default port)", target)
		}
	}
}

// histogramFamily is the family of a series name: a histogram's _bucket, _sum and _count are its
// family's, given exported (family: type).
func histogramFamily(series string, exported map[string]string) string {
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if f, ok := strings.CutSuffix(series, suffix); ok && exported[f] == "histogram" {
			return f
		}
	}
	return series
}

// TestMetricsCountTheQueue: on a statement queue of a turn every 600 ms, three statements at once
// are one allowed and two throttled (served after their waits, both measured), and a fourth, sent
// while those two wait (its turn 1.8 s away), whose client hangs up after 100 ms is abandoned, its
// wait measured too.
func TestMetricsCountTheQueue(t *testing.T) {
	t.Parallel()
	metrics := apitest.FreeAddr(t)
	srv := redistest.Start(t)
	a := startAPI(t, srv, map[string]string{"METRICS_ADDR": metrics,
		"STATEMENT_ALGORITHM": "leaky_bucket", "STATEMENT_LIMIT": "5", "STATEMENT_WINDOW": "3s"}) // a turn every 600 ms
	diego := a.Token(demo[3].Document, demo[3].Password)
	burst := make(chan map[int]int, 1)
	go func() {
		burst <- apitest.Burst([]*apitest.Client{a.Client}, 3, func(c *apitest.Client, _ int) apitest.Response {
			return c.Statement(diego)
		})
	}()
	rdb := srv.Client(nil)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) { // two of them waiting
		keys := rdb.Keys(t.Context(), "rl:statement:leaky_bucket:*").Val()
		if len(keys) == 1 && rdb.ZCount(t.Context(), keys[0], "("+strconv.FormatInt(time.Now().UnixMicro(), 10), "+inf").Val() == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the burst's two statements not waiting their turns within 10s")
		}
	}
	// Sent while the burst's two wait (the last's turn 1.2 s after the first's), its turn comes 1.8 s
	// after the first's: time enough, on a busy machine, for its client to give up after 100 ms.
	req, _ := http.NewRequest(http.MethodGet, a.Base+"/v1/statement", nil)
	req.Header.Set("Authorization", "Bearer "+diego)
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	if resp, err := http.DefaultClient.Do(req.WithContext(ctx)); err == nil {
		resp.Body.Close()
		t.Fatalf("a statement 3 turns away answered %d within 100 ms", resp.StatusCode)
	}
	if statuses := <-burst; statuses[200] != 3 {
		t.Fatalf("3 statements at once on a queue of 5 places: %v, want 3 × 200", statuses)
	}
	var m map[string]float64
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		// A scrape gathers the families at once, each as it is then: the abandoned request's wait
		// and its outcome may show in different scrapes.
		if m = scrape(t, metrics); decisions(m, "statement", "abandoned") == 1 && m[`pixlimit_ratelimit_wait_seconds_count{policy="statement"}`] == 3 {
			break
		}
	}
	for outcome, want := range map[string]float64{"allowed": 1, "throttled": 2, "abandoned": 1} {
		if got := decisions(m, "statement", outcome); got != want {
			t.Errorf("statement %s = %v, want %v", outcome, got, want)
		}
	}
	if got := m[`pixlimit_ratelimit_wait_seconds_count{policy="statement"}`]; got != 3 {
		t.Errorf("waits measured: %v, want 3 (two served, one abandoned)", got)
	}
}
