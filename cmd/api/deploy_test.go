package main

import (
	"fmt"
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

	"github.com/pixlimit/pixlimit/internal/apitest"
	"github.com/pixlimit/pixlimit/internal/config"
	"github.com/pixlimit/pixlimit/internal/redistest"
)

// compose is the part of docker-compose.yml these tests read.
type compose struct {
	Services map[string]struct {
		Image       string            `yaml:"image"`
		Build       any               `yaml:"build"`
		Environment map[string]string `yaml:"environment"`
		Healthcheck struct {
			Test []string `yaml:"test"`
		} `yaml:"healthcheck"`
		DependsOn map[string]struct {
			Condition string `yaml:"condition"`
		} `yaml:"depends_on"`
		Ports    []string `yaml:"ports"`
		Networks any      `yaml:"networks"`
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
			if s.Build == nil {
				t.Errorf("%s: image %q is not pinned to a version", name, s.Image)
			}
		}
		if name != "proxy" && len(s.Healthcheck.Test) == 0 {
			t.Errorf("%s has no healthcheck", name)
		}
	}
	if img := c.Services["redis"].Image; !strings.HasPrefix(img, "redis:7.") {
		t.Errorf("redis image %q, want a pinned 7.x", img)
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

	// A plain `docker compose up` exposes the public door and nothing else.
	for name, s := range c.Services {
		if want := map[bool][]string{true: {"8080:8080"}}[name == "proxy"]; !slices.Equal(s.Ports, want) {
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

	conf, err := os.ReadFile(repo("deploy/nginx.conf"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(conf), "$http_x_forwarded_for") || strings.Contains(string(conf), "8081") {
		t.Error("deploy/nginx.conf, served by every fleet, passes the client's X-Forwarded-For through: that is the lab door's job")
	}
}

// TestPublishedSecretsAreRefused finds every AUTH_SECRET value written in the repository's
// documentation and deployment files and checks that the API refuses to start with it.
func TestPublishedSecretsAreRefused(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob(repo("docs/*.md"))
	if err != nil {
		t.Fatal(err)
	}
	more, _ := filepath.Glob(repo("deploy/*.conf"))
	yml, _ := filepath.Glob(repo("deploy/*.yml"))
	files = append(append(append(files, more...), yml...), repo("README.md"), repo("docker-compose.yml"),
		repo("docker-compose.lab.yml"), repo("docker-compose.observability.yml"), repo("Dockerfile"))
	// NAME=value, NAME: value, "NAME": "value" and compose's ${NAME:-value}, of 16 bytes or more.
	assignment := regexp.MustCompile(`AUTH_SECRET(?::-|["']?\s*[:=]\s*["']?)([^\s"'$}]{16,})`)
	texts := map[string]string{ // what this repository once published, as the scan must catch it
		"old docker-compose.yml": "AUTH_SECRET: ${AUTH_SECRET:-dev-only-secret-change-me-0123456789abcdef}",
		"old api_test.go":        `"AUTH_SECRET": "test-secret-test-secret-test-secret!",`,
	}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		texts[f] = string(raw)
	}
	found := 0
	for f, text := range texts {
		for _, m := range assignment.FindAllStringSubmatch(text, -1) {
			found++
			_, err := config.Load(config.Map(map[string]string{"AUTH_SECRET": m[1]}))
			if err == nil || !strings.Contains(err.Error(), "AUTH_SECRET:") {
				t.Errorf("%s publishes AUTH_SECRET %q, and the API accepts it", f, m[1])
			}
		}
	}
	if found < 2 {
		t.Fatalf("the scan found %d values, want at least the 2 historical ones", found)
	}
	t.Logf("%d literal AUTH_SECRET values in %d texts, all refused", found, len(texts))
}

// TestProxyConfig runs deploy/nginx.conf for real in front of two API processes (where nginx is
// installed): the public door discards a client's X-Forwarded-For, the lab door passes it on.
func TestProxyConfig(t *testing.T) {
	t.Parallel()
	nginx, err := exec.LookPath("nginx")
	if err != nil {
		t.Skip("nginx is not installed; TestComposeFile still checks the compose file")
	}
	srv := redistest.Start(t)
	env := map[string]string{"TRUSTED_PROXIES": "127.0.0.1/32", "LOGIN_IP_LIMIT": "3"}
	a, b := startAPI(t, srv, env), startAPI(t, srv, env)
	public, lab := apitest.FreeAddr(t), apitest.FreeAddr(t)

	var conf []byte
	for _, f := range []string{"deploy/nginx.conf", "deploy/nginx-lab.conf"} { // the lab fleet's proxy
		b, err := os.ReadFile(repo(f))
		if err != nil {
			t.Fatal(err)
		}
		conf = append(conf, b...)
	}
	dir := t.TempDir()
	c := strings.NewReplacer("api-1:8080", strings.TrimPrefix(a.Base, "http://"), "api-2:8080", strings.TrimPrefix(b.Base, "http://"),
		"listen 8080;", "listen "+public+";", "listen 8081;", "listen "+lab+";").Replace(string(conf))
	// One process, no daemon: killing it leaves no orphaned workers behind.
	main := fmt.Sprintf("daemon off;\nmaster_process off;\npid %[1]s/nginx.pid;\nerror_log %[1]s/error.log;\nevents {}\nhttp {\naccess_log off;\n"+
		"client_body_temp_path %[1]s; proxy_temp_path %[1]s; fastcgi_temp_path %[1]s; uwsgi_temp_path %[1]s; scgi_temp_path %[1]s;\n%[2]s\n}\n", dir, c)
	if err := os.WriteFile(filepath.Join(dir, "nginx.conf"), []byte(main), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(nginx, "-c", filepath.Join(dir, "nginx.conf"), "-e", filepath.Join(dir, "error.log"))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if r, err := http.Get("http://" + public + "/healthz"); err == nil {
			r.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "error.log"))
			t.Fatalf("nginx did not start:\n%s", log)
		}
	}

	door := func(addr string) *apitest.Client { return &apitest.Client{T: t, Base: "http://" + addr} }
	for i := range 4 { // rotating X-Forwarded-For through the public door: still one client
		r := door(public).Do(http.MethodPost, "/v1/login", `{"document":"x","password":"y"}`, "X-Forwarded-For", fmt.Sprintf("203.0.113.%d", i))
		if want := map[bool]int{true: 429, false: 400}[i == 3]; r.Status != want {
			t.Fatalf("public door, spoofed X-Forwarded-For, request %d: %v, want %d", i+1, r, want)
		}
	}
	for i := range 4 { // the lab door: each forwarded address is its own client
		r := door(lab).Do(http.MethodPost, "/v1/login", `{"document":"x","password":"y"}`, "X-Forwarded-For", fmt.Sprintf("198.51.100.%d", i))
		if r.Status != http.StatusBadRequest {
			t.Fatalf("lab door, client %d: %v, want 400 (not limited)", i+1, r)
		}
	}
}
