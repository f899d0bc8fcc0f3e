package main

import (
	"cmp"
	"crypto/rand"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/pixlimit/pixlimit/internal/config"
	"github.com/pixlimit/pixlimit/internal/httpapi"
	"github.com/pixlimit/pixlimit/internal/testing/apitest"
	"github.com/pixlimit/pixlimit/internal/testing/redistest"
)

// compose is the part of docker-compose.yml these tests read.
type compose struct {
	Services map[string]struct {
		Image       string            `yaml:"image"`
		Command     []string          `yaml:"command"`
		Build       any               `yaml:"build"`
		Environment map[string]string `yaml:"environment"`
		Healthcheck struct {
			Test []string `yaml:"test"`
		} `yaml:"healthcheck"`
		DependsOn map[string]struct {
			Condition string `yaml:"condition"`
		} `yaml:"depends_on"`
		Ports           []string `yaml:"ports"`
		Networks        any      `yaml:"networks"`
		StopGracePeriod string   `yaml:"stop_grace_period"`
	} `yaml:"services"`
}

// repo is a path from the repository's root, where these files live (tests run in cmd/api).
func repo(path string) string { return filepath.Join("..", "..", path) }

func readCompose(t *testing.T, name string) compose {
	t.Helper()
	raw, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	var c compose
	if err := yaml.Unmarshal(raw, &c); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return c
}

func TestComposeFile(t *testing.T) {
	t.Parallel()
	c := readCompose(t, repo("docker-compose.yml"))
	for _, name := range []string{"redis", "postgres", "api-1", "api-2", "proxy"} {
		s, ok := c.Services[name]
		if !ok {
			t.Fatalf("no service %s", name)
		}
		if tag := s.Image[strings.LastIndex(s.Image, ":")+1:]; !strings.Contains(s.Image, ":") || tag == "latest" || !strings.ContainsAny(tag[:1], "0123456789") {
			if s.Build == nil && s.Image != c.Services["api-1"].Image { // built here, not pulled
				t.Errorf("%s: image %q is not pinned to a version", name, s.Image)
			}
		}
		if len(s.Healthcheck.Test) == 0 {
			t.Errorf("%s has no healthcheck", name)
		}
	}
	if img := c.Services["redis"].Image; !strings.HasPrefix(img, "redis:7.") {
		t.Errorf("redis image %q, want a pinned 7.x", img)
	}
	// One image, built once: api-1 builds it, api-2 runs it.
	if c.Services["api-1"].Build == nil || c.Services["api-2"].Build != nil || c.Services["api-1"].Image != c.Services["api-2"].Image {
		t.Error("want api-1 to build the image and api-2 to run the same image without building it again")
	}
	// PostgreSQL's healthcheck asks over TCP: the image's init phase listens on the socket only.
	if hc := strings.Join(c.Services["postgres"].Healthcheck.Test, " "); !strings.Contains(hc, "-h 127.0.0.1") {
		t.Errorf("postgres healthcheck %q can pass during the init phase; want it over TCP (-h 127.0.0.1)", hc)
	}
	// The API's stop fits in the stop timeout, so it ends before Docker's SIGKILL: the drain, the
	// desk's last summaries and a second for the rest.
	if grace, err := time.ParseDuration(c.Services["api-1"].StopGracePeriod); err != nil || grace <= shutdownGrace+httpapi.DeskCloseTimeout+time.Second {
		t.Errorf("api stop_grace_period %q, want longer than the drain (%s), the desk's close (%s) and a second", c.Services["api-1"].StopGracePeriod,
			shutdownGrace, httpapi.DeskCloseTimeout)
	}
	// The proxy's soft stop waits for the answers under way (a PIX's, up to the write timeout),
	// ended by its hard-stop-after, which fits in its stop_grace_period.
	proxyConf, err := os.ReadFile(repo("deploy/haproxy.cfg"))
	if err != nil {
		t.Fatal(err)
	}
	hard := regexp.MustCompile(`(?m)^\s*hard-stop-after\s+(\S+)`).FindSubmatch(proxyConf)
	grace, graceErr := time.ParseDuration(c.Services["proxy"].StopGracePeriod)
	if hard == nil {
		t.Error("deploy/haproxy.cfg sets no hard-stop-after: a soft stop could outlast compose's grace")
	} else if stop, err := time.ParseDuration(string(hard[1])); err != nil || graceErr != nil || stop <= config.WriteTimeout || stop >= grace {
		t.Errorf("proxy: hard-stop-after %s, stop_grace_period %q; want the write timeout (%s) < hard-stop-after < the grace", hard[1], c.Services["proxy"].StopGracePeriod, config.WriteTimeout)
	}

	// The API replicas: one configuration, shared secrets and stores, started only when their
	// stores are healthy, trusting only the proxy's fixed address.
	api1, api2 := c.Services["api-1"], c.Services["api-2"]
	for _, k := range []string{"AUTH_SECRET", "REDIS_URL", "DATABASE_URL", "TRUSTED_PROXIES"} {
		if api1.Environment[k] == "" || api1.Environment[k] != api2.Environment[k] {
			t.Errorf("%s: api-1 %q, api-2 %q; want one shared value", k, api1.Environment[k], api2.Environment[k])
		}
	}
	for _, dep := range []string{"redis", "postgres"} {
		if api1.DependsOn[dep].Condition != "service_healthy" {
			t.Errorf("api waits for %s with %q, want service_healthy", dep, api1.DependsOn[dep].Condition)
		}
	}
	proxy := c.Services["proxy"]
	for _, dep := range []string{"api-1", "api-2"} {
		if proxy.DependsOn[dep].Condition != "service_healthy" {
			t.Errorf("proxy waits for %s with %q, want service_healthy", dep, proxy.DependsOn[dep].Condition)
		}
	}
	var proxyAddr netip.Addr
	if nets, ok := proxy.Networks.(map[string]any); ok {
		for _, n := range nets {
			if m, ok := n.(map[string]any); ok {
				proxyAddr, _ = netip.ParseAddr(fmt.Sprint(m["ipv4_address"]))
			}
		}
	}
	if !proxyAddr.IsValid() {
		t.Fatal("the proxy has no fixed ipv4_address for the API to trust")
	}
	if got, want := api1.Environment["TRUSTED_PROXIES"], proxyAddr.String()+"/32"; got != want {
		t.Errorf("TRUSTED_PROXIES = %q, want only the proxy, %q", got, want)
	}

	// No published secret: compose refuses to start without the operator's own, and says how.
	if s := api1.Environment["AUTH_SECRET"]; !strings.HasPrefix(s, "${AUTH_SECRET:?") || !strings.Contains(s, "openssl rand") {
		t.Errorf("AUTH_SECRET = %q, want ${AUTH_SECRET:?<how to make one>}: no default", s)
	}
	if api1.Environment["DEMO_ACCOUNTS"] != "true" {
		t.Errorf("DEMO_ACCOUNTS = %q, want an explicit true: the demo fleet seeds them on purpose", api1.Environment["DEMO_ACCOUNTS"])
	}

	// A plain `docker compose up` exposes the public door and nothing else, on this machine only:
	// the demo accounts' passwords are published, so the fleet that seeds them is no one else's
	// to reach (and an IPv6 client, through Docker's proxy, would share one login IP key).
	for name, s := range c.Services {
		if want := map[bool][]string{true: {"127.0.0.1:8080:8080"}}[name == "proxy"]; !slices.Equal(s.Ports, want) {
			t.Errorf("%s publishes %v, want %v", name, s.Ports, want)
		}
	}

	// The lab doors come only with docker-compose.lab.yml, and only on this machine.
	lab := readCompose(t, repo("docker-compose.lab.yml"))
	if got := lab.Services["redis"].Ports; !slices.Equal(got, []string{"127.0.0.1:6380:6379"}) {
		t.Errorf("lab redis ports %v, want 127.0.0.1:6380:6379", got)
	}
	if got := lab.Services["proxy"].Ports; !slices.Equal(got, []string{"127.0.0.1:8081:8081"}) {
		t.Errorf("lab proxy ports %v, want 127.0.0.1:8081:8081", got)
	}
	// Prometheus and Grafana come with their own file: nothing published but Grafana, on this
	// machine, with no default password.
	obs := readCompose(t, repo("docker-compose.observability.yml"))
	if got := obs.Services["grafana"].Ports; !slices.Equal(got, []string{"127.0.0.1:3000:3000"}) {
		t.Errorf("grafana ports %v, want 127.0.0.1:3000:3000 only", got)
	}
	if len(obs.Services["prometheus"].Ports) != 0 {
		t.Errorf("prometheus publishes %v, want nothing", obs.Services["prometheus"].Ports)
	}
	if pw := obs.Services["grafana"].Environment["GF_SECURITY_ADMIN_PASSWORD"]; !strings.HasPrefix(pw, "${GRAFANA_ADMIN_PASSWORD:?") {
		t.Errorf("GF_SECURITY_ADMIN_PASSWORD = %q, want ${GRAFANA_ADMIN_PASSWORD:?...}: no default", pw)
	}
	for name, s := range obs.Services {
		if tag := s.Image[strings.LastIndex(s.Image, ":")+1:]; tag == "latest" || !strings.Contains(s.Image, ":") {
			t.Errorf("%s: image %q is not pinned", name, s.Image)
		}
	}

	conf, err := os.ReadFile(repo("deploy/haproxy.cfg"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(conf), "http-request set-header X-Forwarded-For %[src]\n") || strings.Contains(string(conf), "8081") {
		t.Error("deploy/haproxy.cfg, served by every fleet, must overwrite X-Forwarded-For; passing the client's through is the lab door's job")
	}
}

// TestPublishedSecretsAreRefused finds every secret written in the repository (a literal given
// to AUTH_SECRET or ADMIN_TOKEN, in documentation, deployment files and Go code, tests included,
// or held by a Go name that says secret or token) and checks that the API refuses to start with
// it as either.
func TestPublishedSecretsAreRefused(t *testing.T) {
	t.Parallel()
	// NAME=value, NAME: value, "NAME": "value", {"NAME", "value"} and compose's ${NAME:-value}.
	assignment := regexp.MustCompile(`(?:AUTH_SECRET|ADMIN_TOKEN)(?::-|["']?\s*[:=,]\s*["'` + "`" + `]?)([^\s"'` + "`" + `$}]{16,})`)
	// In Go: secret := "value", const adminToken = "value", Token: "value" and the like.
	named := regexp.MustCompile(`(?i)\w*(?:secret|token)\w*\s*(?::=|=|:)\s*"([^"\s]{16,})"`)
	texts := map[string]string{ // what this repository once published, as the scan must catch it
		"old docker-compose.yml":    "AUTH_SECRET: ${AUTH_SECRET:-dev-only-secret-change-me-0123456789abcdef}",
		"old api_test.go":           `"AUTH_SECRET": "test-secret-test-secret-test-secret!",`,
		"old config_test.go":        `{"AUTH_SECRET", "0f1e2d3c4b5a69788796a5b4c3d2e1f0", true},`,
		"old httpapi/admin_test.go": `const token = "a-desk-token-of-at-least-32-bytes-long"`,
	}
	err := filepath.WalkDir(repo("."), func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules") {
			return cmp.Or(err, fs.SkipDir)
		}
		switch filepath.Ext(path) {
		case ".go", ".md", ".yml", ".yaml", ".cfg", ".sh", ".env", ".json", ".toml", ".txt":
		default:
			if d.Name() != "Dockerfile" {
				return nil
			}
		}
		raw, err := os.ReadFile(path)
		texts[path] = string(raw)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]string{} // value: where
	for f, text := range texts {
		for _, m := range assignment.FindAllStringSubmatch(text, -1) {
			found[m[1]] = f
		}
		if strings.HasSuffix(f, ".go") {
			for _, m := range named.FindAllStringSubmatch(text, -1) {
				found[m[1]] = f
			}
		}
	}
	for value, f := range found {
		for _, name := range []string{"AUTH_SECRET", "ADMIN_TOKEN"} {
			env := map[string]string{"AUTH_SECRET": rand.Text() + rand.Text(), "ADMIN_ADDR": "127.0.0.1:0", "ADMIN_TOKEN": rand.Text() + rand.Text()}
			env[name] = value
			if _, err := config.Load(config.Map(env)); err == nil || !strings.Contains(err.Error(), name+":") {
				t.Errorf("%s publishes %q, and the API accepts it as %s", f, value, name)
			}
		}
	}
	fromFiles := 0
	for _, f := range found {
		if strings.HasPrefix(f, repo(".")) {
			fromFiles++
		}
	}
	if len(texts) < 150 || fromFiles == 0 || len(found) < 4 {
		t.Fatalf("the scan read %d texts and found %d values, %d of them in the repository's files: want the repository's files read, "+
			"the 4 historical values and some of its own", len(texts), len(found), fromFiles)
	}
	t.Logf("%d literal secrets in %d texts, all refused", len(found), len(texts))
}

// TestProxyConfig runs deploy/haproxy.cfg and deploy/haproxy-lab.cfg for real (where HAProxy is
// installed) in front of two API processes, each with a Redis of its own so one can lose it
// alone: the public door discards a client's X-Forwarded-For, the lab door passes it on; a
// replica that loses Redis leaves the rotation and comes back; when every replica has lost it,
// the replicas' fail modes answer, not the proxy. deploy/e2e.sh proves the same on Docker.
func TestProxyConfig(t *testing.T) {
	t.Parallel()
	haproxy, err := exec.LookPath("haproxy")
	if err != nil {
		t.Skip("haproxy is not installed; TestComposeFile still checks the compose file")
	}
	redisA, redisB := redistest.Start(t), redistest.Start(t)
	env := map[string]string{"TRUSTED_PROXIES": "127.0.0.1/32", "LOGIN_IP_LIMIT": "2", "REDIS_TIMEOUT": "200ms",
		"LOOKUP_PARTICIPANT_CAPACITY": "1", "LOOKUP_PARTICIPANT_REFILL_PER_MINUTE": "1"} // the bank's DICT quota, spent at once
	a, b := startAPI(t, redisA, env), startAPI(t, redisB, env)
	addrs := apitest.FreeAddrs(t, 3)
	public, lab, health := addrs[0], addrs[1], addrs[2]

	var conf []byte
	for _, f := range []string{"deploy/haproxy.cfg", "deploy/haproxy-lab.cfg"} { // the lab fleet's proxy
		b, err := os.ReadFile(repo(f))
		if err != nil {
			t.Fatal(err)
		}
		conf = append(conf, b...)
	}
	c := strings.NewReplacer("api-1:8080", strings.TrimPrefix(a.Base, "http://"), "api-2:8080", strings.TrimPrefix(b.Base, "http://"),
		"bind :8080", "bind "+public, "bind :8081", "bind "+lab, "bind 127.0.0.1:8404", "bind "+health).Replace(string(conf))
	cfg := filepath.Join(t.TempDir(), "haproxy.cfg")
	if err := os.WriteFile(cfg, []byte(c), 0o644); err != nil {
		t.Fatal(err)
	}
	var logs apitest.Logs
	cmd := exec.Command(haproxy, "-db", "-f", cfg) // in the foreground: killing it leaves nothing behind
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	// servers waits until the proxy reports want ("ready live") and says how long that took.
	servers := func(want string) time.Duration {
		t.Helper()
		start := time.Now()
		var got string
		for time.Since(start) < 10*time.Second {
			if r, err := http.Get("http://" + health + "/servers"); err == nil {
				raw, _ := io.ReadAll(r.Body)
				r.Body.Close()
				if got = strings.TrimSpace(string(raw)); got == want {
					return time.Since(start)
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("the proxy reports %q ready and live replicas, want %q\n%s", got, want, logs.String())
		return 0
	}
	servers("2 2")

	door := func(addr string) *apitest.Client { return &apitest.Client{T: t, Base: "http://" + addr} }
	login := func(addr, from string) apitest.Response {
		return door(addr).Do(http.MethodPost, "/v1/login", `{"document":"x","password":"y"}`, "X-Forwarded-For", from)
	}
	// Rotating X-Forwarded-For through the public door: still one client, so 2 replicas × 2
	// admit 4 at most, whichever replica each request reaches.
	for i := range 5 {
		if r, want := login(public, fmt.Sprintf("203.0.113.%d", i)), map[bool]int{true: 429, false: 400}[i == 4]; r.Status != want {
			t.Fatalf("public door, spoofed X-Forwarded-For, request %d: %v, want %d", i+1, r, want)
		}
	}
	for i := range 5 { // the lab door: each forwarded address is its own client
		if r := login(lab, fmt.Sprintf("198.51.100.%d", i)); r.Status != http.StatusBadRequest {
			t.Fatalf("lab door, client %d: %v, want 400 (not limited)", i+1, r)
		}
	}

	// Answers a client can cause do not take a replica out of the rotation (its checks and its
	// connections do): here 503 lookup_capacity_exhausted, the bank's DICT quota spent; login_busy
	// and ledger_busy are 503s of the same kind. Counted as failed checks, a flood of them would
	// empty the rotation of healthy replicas.
	r := door(lab).Do(http.MethodPost, "/v1/login", fmt.Sprintf(`{"document":%q,"password":%q}`, demo[0].Document, demo[0].Password), "X-Forwarded-For", "198.51.103.2")
	token, _ := r.JSON(t)["access_token"].(string)
	shed := 0
	for range 8 {
		if r := door(lab).Do(http.MethodGet, "/v1/pix/keys/bruno@example.com", nil, "Authorization", "Bearer "+token); r.Status == http.StatusServiceUnavailable {
			shed++
		}
	}
	if shed < 4 {
		t.Fatalf("%d of 8 look-ups were 503 lookup_capacity_exhausted, want most: the check below would check nothing", shed)
	}
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if r, err := http.Get("http://" + health + "/servers"); err == nil {
			raw, _ := io.ReadAll(r.Body)
			r.Body.Close()
			if got := strings.TrimSpace(string(raw)); got != "2 2" {
				t.Fatalf("after %d answers 503 a client caused, the proxy reports %q ready and live replicas, want \"2 2\"", shed, got)
			}
		}
	}

	// One replica loses its Redis: it leaves the rotation, and no client meets its fail mode.
	redisB.Kill()
	t.Logf("a replica without Redis left the rotation in %s", servers("1 2"))
	for i := range 6 {
		if r := login(lab, fmt.Sprintf("198.51.101.%d", i)); r.Status != http.StatusBadRequest {
			t.Fatalf("one replica without Redis, login %d: %v, want 400 from the ready one", i+1, r)
		}
	}
	redisB.Restart()
	t.Logf("it came back %s after its Redis", servers("2 2"))

	// Every replica loses Redis: the replicas answer with their fail modes, not the proxy with 503.
	redisA.Kill()
	redisB.Kill()
	servers("0 2")
	for i := range 4 {
		r := login(lab, fmt.Sprintf("198.51.102.%d", i))
		if got := r.JSON(t)["error"]; r.Status != http.StatusTooManyRequests || got != "rate_limiter_unavailable" {
			t.Fatalf("every replica without Redis, login %d: %v, want 429 rate_limiter_unavailable", i+1, r)
		}
	}
}

// TestTheImageHoldsTheAPIAlone: the image's last stage, the one that runs, copies in the api
// binary and nothing else (the demo, with its published passwords' accounts, drives a deployment
// from outside), and runs it as a user other than root.
func TestTheImageHoldsTheAPIAlone(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(repo("Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	var stages [][]string // each stage's instructions, continued lines joined
	for _, line := range strings.Split(strings.ReplaceAll(string(raw), "\\\n", " "), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) == 0 || strings.HasPrefix(f[0], "#"):
			continue
		case strings.EqualFold(f[0], "FROM"):
			stages = append(stages, nil)
		}
		if len(stages) > 0 {
			stages[len(stages)-1] = append(stages[len(stages)-1], strings.ToUpper(f[0])+" "+strings.Join(f[1:], " "))
		}
	}
	if len(stages) < 2 {
		t.Fatalf("%d stages, want a build stage and a running one", len(stages))
	}
	var copied []string
	user := ""
	for _, in := range stages[len(stages)-1] {
		switch op, arg, _ := strings.Cut(in, " "); op {
		case "COPY", "ADD":
			copied = append(copied, in)
		case "USER":
			user = arg
		}
	}
	if want := []string{"COPY --from=build /out/api /usr/local/bin/"}; !slices.Equal(copied, want) {
		t.Errorf("the running stage copies %q, want %q alone", copied, want)
	}
	if user == "" || strings.HasPrefix(user, "root") || strings.HasPrefix(user, "0") {
		t.Errorf("the running stage's user %q, want a user other than root", user)
	}
}

// TestTheImageHasWhatTheBuildEmbeds: every file a package of the module embeds (go list's
// EmbedFiles) is in the Docker build context, whatever .dockerignore excludes: an excluded one
// fails the image's go build (docs/openapi.yaml did, in an e2e run), which no other test builds.
// The patterns are read as Docker does for these: the last matching line wins, "!" re-includes,
// and a pattern matches a path or any directory above it.
func TestTheImageHasWhatTheBuildEmbeds(t *testing.T) {
	raw, err := os.ReadFile("../../.dockerignore")
	if err != nil {
		t.Fatal(err)
	}
	var patterns []string
	for _, line := range strings.Split(string(raw), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			patterns = append(patterns, line)
		}
	}
	excluded := func(path string) bool {
		out := false
		for _, p := range patterns {
			neg := strings.HasPrefix(p, "!")
			p = strings.TrimPrefix(strings.TrimPrefix(p, "!"), "/")
			for dir := path; dir != "."; dir = filepath.Dir(dir) {
				if ok, _ := filepath.Match(p, dir); ok {
					out = !neg
					break
				}
			}
		}
		return out
	}
	cmd := exec.Command("go", "list", "-f", `{{range .EmbedFiles}}{{$.Dir}}/{{.}}{{"\n"}}{{end}}`, "../../...")
	listed, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	root, _ := filepath.Abs("../..")
	n := 0
	for _, f := range strings.Fields(string(listed)) {
		rel, err := filepath.Rel(root, f)
		if err != nil {
			t.Fatal(err)
		}
		n++
		if excluded(rel) {
			t.Errorf("%s is embedded but .dockerignore keeps it out of the image's build", rel)
		}
	}
	if n < 3 {
		t.Fatalf("go list found %d embedded files; the check checked nothing", n)
	}
	if !excluded("docs/api.md") || !excluded(".git/HEAD") {
		t.Error("the patterns are misread: docs/api.md and .git are excluded")
	}
}
