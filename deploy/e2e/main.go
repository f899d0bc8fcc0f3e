// Command e2e proves the compose fleet on a real Docker engine: it brings the fleet up with the
// lab doors and Prometheus, runs the demo against it, checks that the public door ignores a
// spoofed X-Forwarded-For, then runs the failure drills, asks Prometheus the dashboard's
// queries, and prints a table of what each one saw. It tears
// the fleet down and exits non-zero if anything failed. deploy/e2e.sh runs it (and, with
// --standins, builds the stand-in base images first); run it from the repository's root.
//
// Every drill sends traffic only to the fleet's doors on 127.0.0.1, and every loop is bounded in
// time.
package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	api "github.com/pixlimit/pixlimit/client"
	"github.com/pixlimit/pixlimit/internal/pix"
)

const (
	public = "http://127.0.0.1:8080" // the public door
	lab    = "http://127.0.0.1:8081" // the lab door: X-Forwarded-For passes through
	// The key the drills pay: Ana's.
	payee = "ana@example.com"
)

// drillAccount is the demo account the drills log in as: Diego.
func drillAccount() api.Account { return api.DemoAccounts()[3] }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("e2e", flag.ContinueOnError)
	project := fs.String("project", "pixlimit-e2e", "the compose project `name` (its containers, networks and volume)")
	keep := fs.Bool("keep", false, "leave the fleet running at the end (for a look around)")
	skipDemo := fs.Bool("skip-demo", false, "do not run the demo against the fleet")
	only := fs.String("only", "", "run only the drills `named` here, comma-separated: "+strings.Join(slices.Sorted(maps.Keys(drills)), ", "))
	if err := fs.Parse(args); err != nil {
		return err
	}
	f := &fleet{project: *project, secret: rand.Text() + rand.Text(), log: stderr}
	defer func() {
		if !*keep {
			f.logf("tearing down")
			_ = f.compose(context.WithoutCancel(ctx), "down", "-v", "--remove-orphans", "--timeout", "15")
		}
	}()

	services, err := f.services(ctx)
	if err != nil {
		return err
	}
	f.logf("building and starting the fleet (docker compose up --build --wait %s)", strings.Join(services, " "))
	start := time.Now()
	if err := f.compose(ctx, append([]string{"up", "-d", "--build", "--wait", "--wait-timeout", "600"}, services...)...); err != nil {
		return fmt.Errorf("the fleet did not come up healthy: %w", err)
	}
	f.logf("the fleet is healthy after %s", time.Since(start).Round(time.Second))

	var rows []row
	if !*skipDemo {
		f.logf("running the demo against the lab doors")
		demo := exec.CommandContext(ctx, "go", "run", "./cmd/demo", "-target", lab, "-redis", "redis://127.0.0.1:6380")
		out, err := demo.CombinedOutput()
		last := lastLine(string(out))
		rows = append(rows, row{name: "demo against the fleet", saw: last, ok: err == nil})
		if err != nil {
			fmt.Fprintf(stderr, "%s\n", out)
		}
	}
	rows = append(rows, spoofing(ctx))

	c := &client{http: &http.Client{Timeout: 10 * time.Second}}
	if err := c.login(ctx); err != nil {
		return err
	}
	for _, name := range drillOrder {
		if *only != "" && !slices.Contains(strings.Split(*only, ","), name) {
			continue
		}
		d := drills[name]
		if ctx.Err() != nil {
			return ctx.Err()
		}
		rows = append(rows, d(ctx, f, c))
		if _, err := f.until(ctx, 2, 60*time.Second); err != nil {
			rows = append(rows, row{name: "fleet back to 2 ready replicas", saw: err.Error()})
			break
		}
	}

	if ctx.Err() == nil {
		rows = append(rows, dashboard(ctx, f))
	}

	return report(stdout, rows)
}

// report writes rows as a table, and fails if any check did.
func report(stdout io.Writer, rows []row) error {
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "drill\tverdict\twhat it saw")
	failed := 0
	for _, r := range rows {
		verdict := "ok"
		if !r.ok {
			verdict, failed = "FAIL", failed+1
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", r.name, verdict, r.saw)
	}
	tw.Flush()
	if failed > 0 {
		return fmt.Errorf("%d of %d checks failed", failed, len(rows))
	}
	fmt.Fprintf(stdout, "all %d checks passed\n", len(rows))
	return nil
}

// drills are the failure drills by name, run in drillOrder.
var drills = map[string]func(context.Context, *fleet, *client) row{
	"redis-stopped": redisStopped, "replica-restarted": replicaRestarted, "replica-stopped": replicaStopped,
	"replica-cut": replicaCut, "all-cut-from-redis": allCutFromRedis,
}

var drillOrder = []string{"redis-stopped", "replica-restarted", "replica-stopped", "replica-cut", "all-cut-from-redis"}

// row is one line of the table: a drill, whether it held, and what it saw.
type row struct {
	name, saw string
	ok        bool
}

// fleet runs docker and docker compose on the project.
type fleet struct {
	project, secret string
	log             io.Writer
}

func (f *fleet) logf(format string, args ...any) {
	fmt.Fprintf(f.log, "e2e %s  %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// composeFiles are the fleet, its lab doors and the observability services (Prometheus, whose
// answers the dashboard check reads; Grafana, which the drills do not start: see services).
var composeFiles = []string{"-f", "docker-compose.yml", "-f", "docker-compose.lab.yml", "-f", "docker-compose.observability.yml"}

func (f *fleet) command(ctx context.Context, args ...string) *exec.Cmd {
	args = append(append([]string{"compose", "-p", f.project}, composeFiles...), args...)
	cmd := exec.CommandContext(ctx, "docker", args...)
	// Grafana's password is only read for the file's interpolation: Grafana is never started.
	cmd.Env = append(os.Environ(), "AUTH_SECRET="+f.secret, "GRAFANA_ADMIN_PASSWORD="+rand.Text())
	return cmd
}

func (f *fleet) compose(ctx context.Context, args ...string) error {
	cmd := f.command(ctx, args...)
	cmd.Stdout, cmd.Stderr = f.log, f.log
	return cmd.Run()
}

// services are the compose services the drills start: every one but grafana, which has no
// Debian package to stand in for it (deploy/standins/README.md); the dashboard check asks
// Prometheus its panels' queries instead, as Grafana would.
func (f *fleet) services(ctx context.Context) ([]string, error) {
	out, err := f.command(ctx, "config", "--services").Output()
	if err != nil {
		return nil, fmt.Errorf("docker compose config --services: %w", err)
	}
	return slices.DeleteFunc(strings.Fields(string(out)), func(s string) bool { return s == "grafana" }), nil
}

func (f *fleet) docker(ctx context.Context, args ...string) error {
	out, err := exec.CommandContext(ctx, "docker", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("docker %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

func (f *fleet) container(service string) string { return f.project + "-" + service + "-1" }
func (f *fleet) backend() string                 { return f.project + "_backend" }

// ready asks the proxy how many replicas are in the ready rotation (deploy/haproxy.cfg,
// frontend health, /servers), from inside its container: that port is not published.
func (f *fleet) ready(ctx context.Context) (int, error) {
	script := `exec 3<>/dev/tcp/127.0.0.1/8404 && printf 'GET /servers HTTP/1.0\r\n\r\n' >&3 && cat <&3`
	out, err := exec.CommandContext(ctx, "docker", "exec", f.container("proxy"), "bash", "-c", script).Output()
	if err != nil {
		return 0, fmt.Errorf("asking the proxy: %w", err)
	}
	var n, live int
	_, body, _ := strings.Cut(string(out), "\r\n\r\n")
	if _, err := fmt.Sscan(body, &n, &live); err != nil {
		return 0, fmt.Errorf("the proxy's /servers said %q", body)
	}
	return n, nil
}

// watchReadyz asks service's /readyz every 200 ms, from inside the proxy's container (the
// replicas' port is not published), until ctx ends, and says what it answered when: each change
// of its body, with the time since the watch began.
func (f *fleet) watchReadyz(ctx context.Context, service string) string {
	script := `exec 3<>/dev/tcp/` + service + `/8080 && printf 'GET /readyz HTTP/1.0\r\n\r\n' >&3 && cat <&3`
	start := time.Now()
	var seen []string
	last := ""
	for ctx.Err() == nil {
		actx, cancel := context.WithTimeout(ctx, 3*time.Second)
		out, err := exec.CommandContext(actx, "docker", "exec", f.container("proxy"), "bash", "-c", script).Output()
		cancel()
		_, body, _ := strings.Cut(string(out), "\r\n\r\n")
		now := strings.TrimSpace(body)
		if err != nil && ctx.Err() == nil {
			now = "no answer"
		}
		if now != last && now != "" {
			seen = append(seen, fmt.Sprintf("%s at %s", now, time.Since(start).Round(100*time.Millisecond)))
			last = now
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
	if len(seen) == 0 {
		return "nothing"
	}
	return strings.Join(seen, ", ")
}

// until waits, at most limit, until want replicas are ready and says how long that took.
func (f *fleet) until(ctx context.Context, want int, limit time.Duration) (time.Duration, error) {
	start := time.Now()
	for {
		n, err := f.ready(ctx)
		if err == nil && n == want {
			return time.Since(start), nil
		}
		if time.Since(start) > limit {
			return 0, fmt.Errorf("%d ready replicas after %s, want %d (%v)", n, limit, want, err)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// client is the drills' customer: Diego's token, and a fresh client address per login.
type client struct {
	http    *http.Client
	token   string
	mu      sync.Mutex
	ip      int // the last client address handed out
	unknown int // the last unknown document tried
}

// answer is one response, or the failure to get one.
type answer struct {
	status  int
	code    string // the JSON body's "error", if any
	limited bool   // RateLimit-Limit was sent
	policy  string // RateLimit-Policy
	body    []byte
	took    time.Duration
	err     error
	at      time.Time
}

func (a answer) String() string {
	if a.err != nil {
		return "no answer: " + a.err.Error()
	}
	if a.code != "" {
		return fmt.Sprintf("%d %s", a.status, a.code)
	}
	return fmt.Sprint(a.status)
}

// proxyError is an answer the API did not give: no answer, or a 5xx without the API's JSON.
func (a answer) proxyError() bool { return a.err != nil || (a.status >= 500 && a.code == "") }

func (c *client) do(ctx context.Context, base, method, path string, body any, headers ...string) answer {
	start := time.Now()
	r, err := (&api.Client{BaseURL: base, HTTP: c.http}).Do(ctx, method, path, body, headers...)
	return answer{status: r.Status, code: r.Code, limited: r.Header.Get("RateLimit-Limit") != "", policy: r.Header.Get("RateLimit-Policy"), body: r.Body,
		took: r.Took, err: err, at: start}
}

// addr is a new client address for the lab door, so no login shares an IP key.
func (c *client) addr() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ip++
	return fmt.Sprintf("198.18.%d.%d", c.ip/250, c.ip%250+1)
}

func (c *client) login(ctx context.Context) error {
	a := c.do(ctx, lab, http.MethodPost, "/v1/login", map[string]string{"document": drillAccount().Document, "password": drillAccount().Password},
		"X-Forwarded-For", c.addr())
	var out struct {
		AccessToken string `json:"access_token"`
	}
	if a.status != http.StatusOK || json.Unmarshal(a.body, &out) != nil || out.AccessToken == "" {
		return fmt.Errorf("login: %s", a)
	}
	c.token = out.AccessToken
	return nil
}

func (c *client) statement(ctx context.Context) answer {
	return c.do(ctx, public, http.MethodGet, "/v1/statement", nil, "Authorization", "Bearer "+c.token)
}

// wrongLogin is a login for a document no account has, from a new address, so it fills no key
// the next one uses: 401 invalid_credentials while the limiter works.
func (c *client) wrongLogin(ctx context.Context) answer {
	c.mu.Lock()
	c.unknown++
	doc, err := pix.CompleteCPF(strconv.Itoa(800000000 + c.unknown))
	c.mu.Unlock()
	if err != nil {
		return answer{err: err}
	}
	return c.do(ctx, lab, http.MethodPost, "/v1/login", map[string]string{"document": doc, "password": "not-it"},
		"X-Forwarded-For", c.addr())
}

func (c *client) pix(ctx context.Context) answer {
	return c.do(ctx, public, http.MethodPost, "/v1/pix", map[string]any{"key": payee, "amount_cents": 1},
		"Authorization", "Bearer "+c.token, "Idempotency-Key", api.NewIdempotencyKey())
}

// load sends statements through the public door from workers goroutines until ctx is done.
func (c *client) load(ctx context.Context, workers int) []answer {
	var mu sync.Mutex
	var all []answer
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for ctx.Err() == nil {
				a := c.statement(context.WithoutCancel(ctx))
				mu.Lock()
				all = append(all, a)
				mu.Unlock()
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	return all
}

// tally sums up answers: how many, how many errors (no answer, 5xx), the slowest.
type tally struct {
	n, errors, fiveHundreds int
	slowest                 time.Duration
	first                   []string // the first few errors, for the table
}

func count(answers []answer, since time.Time) tally {
	var t tally
	for _, a := range answers {
		if a.at.Before(since) {
			continue
		}
		t.n++
		t.slowest = max(t.slowest, a.took)
		if a.status == http.StatusInternalServerError {
			t.fiveHundreds++
		}
		if a.proxyError() || a.status >= 500 {
			t.errors++
			if len(t.first) < 3 {
				t.first = append(t.first, a.String())
			}
		}
	}
	return t
}

func (t tally) String() string {
	s := fmt.Sprintf("%d requests, %d errors, slowest %s", t.n, t.errors, t.slowest.Round(time.Millisecond))
	if len(t.first) > 0 {
		s += " (" + strings.Join(t.first, "; ") + ")"
	}
	return s
}

// spoofing checks the public door: a client rotating X-Forwarded-For is still one client (its
// login IP key fills by the 11th request), while through the lab door each address is its own.
func spoofing(ctx context.Context) row {
	c := &client{http: &http.Client{Timeout: 10 * time.Second}}
	door := func(base string, prefix string) (firstRefusal int) {
		for i := 1; i <= 11; i++ {
			a := c.do(ctx, base, http.MethodPost, "/v1/login", map[string]string{"document": "x", "password": "y"},
				"X-Forwarded-For", fmt.Sprintf("%s.%d", prefix, i))
			if a.status == http.StatusTooManyRequests {
				return i
			}
		}
		return 0
	}
	pub, lb := door(public, "203.0.113"), door(lab, "198.51.100")
	return row{
		name: "public door, spoofed X-Forwarded-For",
		saw:  fmt.Sprintf("11 addresses through the public door: 429 at request %d (want ≤ 11); through the lab door: %d refusals (want 0)", pub, lb),
		ok:   pub > 0 && lb == 0,
	}
}

// statementByRedis is the statement policy as Redis decides it in the compose fleet (30 a
// minute); decided in a replica's memory, the policy shows that replica's share instead.
const statementByRedis = `"statement";q=30;w=60`

// failModes checks what a Redis outage must look like from outside: the statement decided in a
// replica's memory (200, or 429 past its share, with RateLimit headers showing the share), login
// and PIX 429 rate_limiter_unavailable, from the replicas, not the proxy.
func failModes(ctx context.Context, c *client) (string, bool) {
	st, lg, px := c.statement(ctx), c.wrongLogin(ctx), c.pix(ctx)
	ok := (st.status == http.StatusOK || st.status == http.StatusTooManyRequests && st.code == "rate_limit_exceeded") &&
		st.limited && st.policy != statementByRedis &&
		lg.status == http.StatusTooManyRequests && lg.code == "rate_limiter_unavailable" &&
		px.status == http.StatusTooManyRequests && px.code == "rate_limiter_unavailable"
	return fmt.Sprintf("statement %s (%s), login %s, PIX %s", st, st.policy, lg, px), ok
}

// normal checks the limiter is back: a wrong password is 401, a statement decided by Redis.
func normal(ctx context.Context, c *client) bool {
	st, lg := c.statement(ctx), c.wrongLogin(ctx)
	return st.policy == statementByRedis && (st.status == http.StatusOK || st.status == http.StatusTooManyRequests) &&
		lg.status == http.StatusUnauthorized
}

// eventually polls check every 200 ms for at most limit, and says how long it took.
func eventually(ctx context.Context, limit time.Duration, check func() bool) (time.Duration, bool) {
	start := time.Now()
	for time.Since(start) < limit && ctx.Err() == nil {
		if check() {
			return time.Since(start), true
		}
		time.Sleep(200 * time.Millisecond)
	}
	return time.Since(start), false
}

// outage runs one whole-fleet Redis outage: cut, fail modes seen, heal, normal again, with a
// statement load running through it that must never meet a proxy error.
func outage(ctx context.Context, c *client, name string, cut, heal func() error) row {
	loadCtx, stopLoad := context.WithCancel(ctx)
	done := make(chan []answer)
	go func() { done <- c.load(loadCtx, 2) }()
	r := row{name: name}
	var modes string
	var modesOK bool
	err := cut()
	took, seen := eventually(ctx, 15*time.Second, func() bool { modes, modesOK = failModes(ctx, c); return modesOK })
	if err == nil {
		err = heal()
	}
	back, recovered := eventually(ctx, 20*time.Second, func() bool { return normal(ctx, c) })
	stopLoad()
	t := count(<-done, time.Time{})
	r.saw = fmt.Sprintf("fail modes after %s: %s; normal again %s after healing, no restart; load: %s",
		took.Round(100*time.Millisecond), modes, back.Round(100*time.Millisecond), t)
	if err != nil {
		r.saw += "; " + err.Error()
	}
	r.ok = err == nil && seen && recovered && t.errors == 0
	return r
}

func redisStopped(ctx context.Context, f *fleet, c *client) row {
	return outage(ctx, c, "Redis stopped, then started",
		func() error { return f.compose(ctx, "stop", "redis") },
		func() error { return f.compose(ctx, "start", "redis") })
}

func allCutFromRedis(ctx context.Context, f *fleet, c *client) row {
	return outage(ctx, c, "every replica cut off from Redis",
		func() error { return f.docker(ctx, "network", "disconnect", f.backend(), f.container("redis")) },
		func() error {
			return f.docker(ctx, "network", "connect", "--alias", "redis", f.backend(), f.container("redis"))
		})
}

// underLoad runs a statement load, does what to the fleet after a second, waits for settle,
// and returns the answers and when what finished.
func underLoad(ctx context.Context, c *client, what func() error, settle func() error) ([]answer, time.Time, error) {
	loadCtx, stopLoad := context.WithCancel(ctx)
	done := make(chan []answer)
	go func() { done <- c.load(loadCtx, 4) }()
	time.Sleep(time.Second)
	err := what()
	acted := time.Now()
	if err == nil {
		err = settle()
	}
	time.Sleep(2 * time.Second)
	stopLoad()
	return <-done, acted, err
}

func replicaRestarted(ctx context.Context, f *fleet, c *client) row {
	answers, _, err := underLoad(ctx, c,
		func() error { return f.compose(ctx, "restart", "api-1") },
		func() error { _, err := f.until(ctx, 2, 60*time.Second); return err })
	t := count(answers, time.Time{})
	r := row{name: "one replica restarted under load", saw: t.String() + " (want 0 errors)", ok: err == nil && t.errors == 0 && t.n > 0}
	if err != nil {
		r.saw += "; " + err.Error()
	}
	return r
}

func replicaStopped(ctx context.Context, f *fleet, c *client) row {
	var left time.Duration
	answers, _, err := underLoad(ctx, c,
		func() error { return f.compose(ctx, "stop", "api-1") },
		func() error {
			var err error
			if left, err = f.until(ctx, 1, 30*time.Second); err != nil {
				return err
			}
			time.Sleep(5 * time.Second) // traffic on the one replica left
			return nil
		})
	t := count(answers, time.Time{})
	started := f.compose(ctx, "start", "api-1")
	r := row{name: "one replica stopped",
		saw: fmt.Sprintf("%s (want 0 errors, none over ~1 s); out of rotation %s after the stop returned",
			t, left.Round(100*time.Millisecond)),
		ok: err == nil && started == nil && t.errors == 0 && t.slowest <= 1500*time.Millisecond && t.n > 0}
	if err = errors.Join(err, started); err != nil {
		r.saw += "; " + err.Error()
	}
	return r
}

func replicaCut(ctx context.Context, f *fleet, c *client) row {
	var left, back time.Duration
	var readyz string // what the cut replica's /readyz said on its way back
	answers, cut, err := underLoad(ctx, c,
		func() error { return f.docker(ctx, "network", "disconnect", f.backend(), f.container("api-2")) },
		func() error {
			var err error
			if left, err = f.until(ctx, 1, 30*time.Second); err != nil {
				return err
			}
			time.Sleep(8 * time.Second) // traffic with the cut replica out of rotation
			if err := f.docker(ctx, "network", "connect", "--alias", "api-2", f.backend(), f.container("api-2")); err != nil {
				return err
			}
			watchCtx, stopWatch := context.WithCancel(ctx)
			watched := make(chan string)
			go func() { watched <- f.watchReadyz(watchCtx, "api-2") }()
			back, err = f.until(ctx, 2, 30*time.Second)
			stopWatch()
			readyz = <-watched
			return err
		})
	all, after := count(answers, time.Time{}), count(answers, cut.Add(5*time.Second))
	return row{name: "one replica cut off from the backend network",
		saw: fmt.Sprintf("out of rotation %s after the cut, back %s after reconnecting (want ≤ 5 s each; its /readyz meanwhile: %s); %s; from 5 s after the cut: %d errors; 500s: %d",
			left.Round(100*time.Millisecond), back.Round(100*time.Millisecond), readyz, all, after.errors, all.fiveHundreds),
		ok: err == nil && left <= 5*time.Second && back <= 5*time.Second && after.errors == 0 && all.fiveHundreds == 0 && after.n > 0,
	}
}

func lastLine(s string) string {
	lines := slices.DeleteFunc(strings.Split(strings.TrimSpace(s), "\n"), func(l string) bool { return strings.TrimSpace(l) == "" })
	if len(lines) == 0 {
		return "(no output)"
	}
	return strings.TrimSpace(lines[len(lines)-1])
}

// dashboard asks the fleet's Prometheus every query of the Grafana dashboard
// (deploy/grafana/dashboards/pixlimit.json, the one source of them), after both replicas have
// been scraped since the drills, and requires each to return series. It asks through promtool,
// inside the Prometheus container (its port is not published; the official image and the
// stand-in both have promtool on the PATH).
func dashboard(ctx context.Context, f *fleet) row {
	r := row{name: "the dashboard's queries on Prometheus"}
	queries, err := dashboardQueries("deploy/grafana/dashboards/pixlimit.json")
	if err != nil {
		r.saw = err.Error()
		return r
	}
	query := func(expr string) ([]promSample, error) {
		out, err := exec.CommandContext(ctx, "docker", "exec", f.container("prometheus"),
			"promtool", "query", "instant", "-o", "json", "http://127.0.0.1:9090", expr).Output()
		if err != nil {
			return nil, fmt.Errorf("promtool query %q: %w", expr, err)
		}
		var samples []promSample
		if err := json.Unmarshal(out, &samples); err != nil {
			return nil, fmt.Errorf("promtool query %q: %w: %s", expr, err, out)
		}
		return samples, nil
	}
	// Both replicas scraped, and a rate's minute holding samples from after the drills' restarts.
	var up []promSample
	if _, ok := eventually(ctx, 60*time.Second, func() bool {
		up, err = query(`up{job="pixlimit"} == 1`)
		return err == nil && len(up) == 2
	}); !ok {
		r.saw = fmt.Sprintf("Prometheus did not see both replicas up within 60 s: %d up (%v)", len(up), err)
		return r
	}
	time.Sleep(15 * time.Second) // three scrapes at 5 s: every rate has samples to compare
	var counts []string
	empty := 0
	for _, q := range queries {
		samples, err := query(q.expr)
		if err != nil {
			r.saw = err.Error()
			return r
		}
		numbers := 0
		for _, s := range samples {
			if len(s.Value) == 2 && s.Value[1] != "NaN" {
				numbers++
			}
		}
		if len(samples) == 0 {
			empty++
		}
		counts = append(counts, fmt.Sprintf("%d (%d)", len(samples), numbers))
	}
	r.ok = empty == 0 && len(queries) > 0
	r.saw = fmt.Sprintf("%d queries of %d panels, %d without series (want 0); series per query (of them numbers, not NaN): %s",
		len(queries), panels(queries), empty, strings.Join(counts, ", "))
	return r
}

// promSample is one series of an instant query's vector, as promtool -o json prints it.
type promSample struct {
	Metric map[string]string `json:"metric"`
	Value  []any             `json:"value"` // [unix time, "value"]
}

type panelQuery struct{ panel, expr string }

// dashboardQueries reads every target's expression of a Grafana dashboard.
func dashboardQueries(path string) ([]panelQuery, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var qs []panelQuery
	for _, p := range d.Panels {
		for _, t := range p.Targets {
			if t.Expr != "" {
				qs = append(qs, panelQuery{p.Title, t.Expr})
			}
		}
	}
	if len(qs) == 0 {
		return nil, fmt.Errorf("%s: no panel queries", path)
	}
	return qs, nil
}

func panels(qs []panelQuery) int {
	seen := map[string]bool{}
	for _, q := range qs {
		seen[q.panel] = true
	}
	return len(seen)
}
