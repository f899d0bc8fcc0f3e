package pixlimit_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pixlimit/pixlimit"
	"github.com/pixlimit/pixlimit/internal/pix"
	"github.com/pixlimit/pixlimit/internal/redistest"
)

// client gives up on a request after 30 s: a test of an API that hangs fails instead of hanging.
var client = &http.Client{Timeout: 30 * time.Second}

// testSecret is the AUTH_SECRET of every API a test starts, so that the replicas of one test form
// a fleet. Drawn per run: the API refuses every secret published in the repository.
var testSecret = rand.Text() + rand.Text()

// api is one running API process (Run on a free port), driven over real HTTP.
type api struct {
	t    *testing.T
	base string
	logs *syncBuffer
}

// startAPI runs the program against srv with env on top of a test baseline, waits for /healthz,
// and at the end of the test stops it as SIGTERM would and checks it exits cleanly.
func startAPI(t *testing.T, srv *redistest.Server, env map[string]string) *api {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	a, done := launch(t, ctx, srv, env)
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("api exit: %v, want nil after shutdown", err)
			}
		case <-time.After(15 * time.Second):
			t.Error("api did not stop within 15s of shutdown")
		}
	})
	return a
}

// launch runs the program until ctx is done and waits until it is healthy. Run's result
// arrives on the channel.
func launch(t *testing.T, ctx context.Context, srv *redistest.Server, env map[string]string) (*api, <-chan error) {
	t.Helper()
	addr := freeAddr(t)
	vars := map[string]string{
		"HTTP_ADDR":   addr,
		"AUTH_SECRET": testSecret,
		"LOG_LEVEL":   "debug",
		// A generous budget: on a loaded CI machine running tests in parallel under the race
		// detector, 100ms is sometimes not enough, and a timeout fails closed. Outage tests
		// set their own.
		"REDIS_TIMEOUT": "1s",
	}
	if srv != nil {
		vars["REDIS_URL"] = "redis://" + srv.Addr()
	}
	for k, v := range env {
		vars[k] = v
	}
	logs := &syncBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- pixlimit.Run(ctx, []string{"api"}, func(k string) string { return vars[k] }, io.Discard, logs)
	}()
	a := &api{t: t, base: "http://" + addr, logs: logs}
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, err := http.Get(a.base + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return a, done
			}
		}
		select {
		case err := <-done:
			t.Fatalf("api exited before serving: %v\n%s", err, logs)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("api not healthy within 5s\n%s", logs)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestHealthcheckCommand(t *testing.T) {
	t.Parallel()
	a := startAPI(t, nil, nil) // embedded Redis: the command needs only /healthz
	getenv := func(k string) string {
		if k == "HTTP_ADDR" {
			return strings.TrimPrefix(a.base, "http://")
		}
		return ""
	}
	if err := pixlimit.Run(t.Context(), []string{"api", "healthcheck"}, getenv, io.Discard, io.Discard); err != nil {
		t.Errorf("healthcheck against a serving API: %v", err)
	}
	nothing := func(k string) string {
		if k == "HTTP_ADDR" {
			return freeAddr(t)
		}
		return ""
	}
	if err := pixlimit.Run(t.Context(), []string{"api", "healthcheck"}, nothing, io.Discard, io.Discard); err == nil {
		t.Error("healthcheck with nothing listening: nil, want an error")
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// response is what a test looks at: status, headers and the raw body.
type response struct {
	status int
	header http.Header
	body   []byte
	took   time.Duration
}

func (r response) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("body %q is not a JSON object: %v", r.body, err)
	}
	return m
}

func (r response) String() string {
	return fmt.Sprintf("%d %s", r.status, bytes.TrimSpace(r.body))
}

// do sends a request; headers come in pairs (name, value). A body that is not a string is
// encoded as JSON; a string is sent as is, with the JSON content type.
func (a *api) do(method, path string, body any, headers ...string) response {
	a.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		buf, err := json.Marshal(b)
		if err != nil {
			a.t.Fatal(err)
		}
		rd = bytes.NewReader(buf)
	}
	req, err := http.NewRequest(method, a.base+path, rd)
	if err != nil {
		a.t.Fatal(err)
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		if headers[i+1] == "" {
			req.Header.Del(headers[i])
			continue
		}
		req.Header.Set(headers[i], headers[i+1])
	}
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		a.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		a.t.Fatal(err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: b, took: time.Since(start)}
}

func (a *api) login(document, password string, headers ...string) response {
	a.t.Helper()
	return a.do(http.MethodPost, "/v1/login", map[string]string{"document": document, "password": password}, headers...)
}

// token logs in and returns the access token, failing the test otherwise.
func (a *api) token(document, password string, headers ...string) string {
	a.t.Helper()
	r := a.login(document, password, headers...)
	if r.status != http.StatusOK {
		a.t.Fatalf("login %s: %v", document, r)
	}
	return r.json(a.t)["access_token"].(string)
}

func (a *api) pix(token string, key string, cents int64, headers ...string) response {
	a.t.Helper()
	return a.do(http.MethodPost, "/v1/pix", map[string]any{"key": key, "amount_cents": cents},
		append([]string{"Authorization", "Bearer " + token}, headers...)...)
}

func (a *api) statement(token string) response {
	a.t.Helper()
	return a.do(http.MethodGet, "/v1/statement?limit=100", nil, "Authorization", "Bearer "+token)
}

func (a *api) balance(token string) int64 {
	a.t.Helper()
	r := a.statement(token)
	if r.status != http.StatusOK {
		a.t.Fatalf("statement: %v", r)
	}
	return int64(r.json(a.t)["balance_cents"].(float64))
}

// demo holds the contract's demo accounts.
var demo = []struct{ name, document, password, key string }{
	{"ana", "529.982.247-25", "demo-ana-123", "ana@example.com"},
	{"bruno", "390.533.447-05", "demo-bruno-123", "bruno@example.com"},
	{"carla", "111.444.777-35", "demo-carla-123", "carla@example.com"},
	{"diego", "935.411.347-80", "demo-diego-123", "diego@example.com"},
}

// cpf returns the n-th valid CPF made from the 9-digit base 100000000+n; none is an account.
func cpf(n int) string {
	c, err := pix.CompleteCPF(strconv.Itoa(100000000 + n))
	if err != nil {
		panic(err)
	}
	return c
}

// syncBuffer collects a server's logs from its goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}
