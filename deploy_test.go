package pixlimit_test

import (
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

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

func TestComposeFile(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var c compose
	if err := yaml.Unmarshal(raw, &c); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
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

	// Lab doors are bound to loopback; the public door is the proxy's 8080.
	if !slices.Contains(proxy.Ports, "8080:8080") {
		t.Errorf("proxy ports %v, want 8080:8080", proxy.Ports)
	}
	for name, s := range c.Services {
		for _, p := range s.Ports {
			if p != "8080:8080" && !strings.HasPrefix(p, "127.0.0.1:") {
				t.Errorf("%s publishes %q beyond this machine", name, p)
			}
		}
	}
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
	public, lab := freeAddr(t), freeAddr(t)

	conf, err := os.ReadFile("deploy/nginx.conf")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	c := strings.NewReplacer("api-1:8080", strings.TrimPrefix(a.base, "http://"), "api-2:8080", strings.TrimPrefix(b.base, "http://"),
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

	door := func(addr string) *api { return &api{t: t, base: "http://" + addr, logs: &syncBuffer{}} }
	for i := range 4 { // rotating X-Forwarded-For through the public door: still one client
		r := door(public).do(http.MethodPost, "/v1/login", `{"document":"x","password":"y"}`, "X-Forwarded-For", fmt.Sprintf("203.0.113.%d", i))
		if want := map[bool]int{true: 429, false: 400}[i == 3]; r.status != want {
			t.Fatalf("public door, spoofed X-Forwarded-For, request %d: %v, want %d", i+1, r, want)
		}
	}
	for i := range 4 { // the lab door: each forwarded address is its own client
		r := door(lab).do(http.MethodPost, "/v1/login", `{"document":"x","password":"y"}`, "X-Forwarded-For", fmt.Sprintf("198.51.100.%d", i))
		if r.status != http.StatusBadRequest {
			t.Fatalf("lab door, client %d: %v, want 400 (not limited)", i+1, r)
		}
	}
}
