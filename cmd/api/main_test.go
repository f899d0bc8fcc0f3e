package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pixlimit/pixlimit"
	"github.com/pixlimit/pixlimit/internal/config"
	"github.com/pixlimit/pixlimit/internal/pix"
	"github.com/pixlimit/pixlimit/internal/testing/apitest"
	"github.com/pixlimit/pixlimit/internal/testing/redistest"
)

// testSecret is the AUTH_SECRET of every API a test starts, so that the replicas of one test form
// a fleet. Drawn per run: the API refuses every secret published in the repository.
var testSecret = rand.Text() + rand.Text()

// demo holds the contract's demo accounts.
var demo = apitest.Demo

// api is one running API program (run on a free port), driven over real HTTP.
type api struct {
	*apitest.Client
	logs *apitest.Logs
}

// startAPI runs the program against srv with env on top of a test baseline, waits for /healthz,
// and at the end of the test stops it as SIGTERM would and checks it exits cleanly.
func startAPI(t *testing.T, srv *redistest.Server, env map[string]string) *api {
	t.Helper()
	return startAPIAt(t, srv, env, apitest.PasswordCost)
}

// startAPIAt is startAPI with the passwords hashed at passwordCost (see launchAt).
func startAPIAt(t *testing.T, srv *redistest.Server, env map[string]string, passwordCost int) *api {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	a, done := launchAt(t, ctx, srv, env, passwordCost)
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

// launch runs the program until ctx is done and waits until it is healthy. run's result arrives
// on the channel. Its passwords are hashed at the tests' cost (apitest.PasswordCost).
func launch(t *testing.T, ctx context.Context, srv *redistest.Server, env map[string]string) (*api, <-chan error) {
	t.Helper()
	return launchAt(t, ctx, srv, env, apitest.PasswordCost)
}

// launchAt is launch with the passwords hashed at passwordCost: a test of what bcrypt's time
// does passes a real deployment's (auth.DefaultPasswordCost).
func launchAt(t *testing.T, ctx context.Context, srv *redistest.Server, env map[string]string, passwordCost int) (*api, <-chan error) {
	t.Helper()
	addr := apitest.FreeAddr(t)
	for addr == env["METRICS_ADDR"] { // the kernel may hand out a port just closed again
		addr = apitest.FreeAddr(t)
	}
	vars := map[string]string{
		"HTTP_ADDR":   addr,
		"AUTH_SECRET": testSecret,
		"LOG_LEVEL":   "debug",
		// A generous budget: on a loaded CI machine running tests in parallel under the race
		// detector, 100ms is sometimes not enough, and a timeout fails closed. Outage tests
		// set their own.
		"REDIS_TIMEOUT": "1s",
		"METRICS_ADDR":  "", // tests that read metrics ask for a free port
		// The night-time cap would make tests depend on the hour they run at; the tests of the
		// cap set a night around now.
		"NIGHT_LIMIT_CENTS": "0",
		// Likewise the day limit and the new-device caps: every test's logins are new devices.
		// The tests of the money limits set them.
		"DAY_LIMIT_CENTS": "0", "NEW_DEVICE_TRANSFER_LIMIT_CENTS": "0", "NEW_DEVICE_DAY_LIMIT_CENTS": "0",
	}
	if srv != nil {
		vars["REDIS_URL"] = "redis://" + srv.Addr()
	}
	for k, v := range env {
		vars[k] = v
	}
	logs := &apitest.Logs{}
	done := make(chan error, 1)
	go func() {
		done <- runReplica(ctx, []string{"api"}, config.Pairs(vars), io.Discard, logs, passwordCost)
	}()
	a := &api{Client: &apitest.Client{T: t, Base: "http://" + addr}, logs: logs}
	// A bound, not a figure: a replica starts in a fraction of a second, but at a real
	// deployment's bcrypt cost its dummy hash alone takes seconds under the race detector beside
	// two CPU burners.
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(a.Base + "/healthz")
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
			t.Fatalf("api not healthy within 30s\n%s", logs)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestHealthcheckCommand(t *testing.T) {
	t.Parallel()
	a := startAPI(t, nil, nil) // embedded Redis: the command needs only /healthz
	serving := config.Pairs(map[string]string{"HTTP_ADDR": strings.TrimPrefix(a.Base, "http://")})
	if err := run(t.Context(), []string{"api", "healthcheck"}, serving, io.Discard, io.Discard); err != nil {
		t.Errorf("healthcheck against a serving API: %v", err)
	}
	nothing := config.Pairs(map[string]string{"HTTP_ADDR": apitest.FreeAddr(t)})
	if err := run(t.Context(), []string{"api", "healthcheck"}, nothing, io.Discard, io.Discard); err == nil {
		t.Error("healthcheck with nothing listening: nil, want an error")
	}
}

func TestConfigErrorsStopTheProgram(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		env   map[string]string
		names []string
	}{
		{map[string]string{"PIX_LIMIT": "0"}, []string{"PIX_LIMIT"}},
		{map[string]string{"LOGIN_WINDOW": "90ms"}, []string{"LOGIN_WINDOW"}},
		{map[string]string{"TRUSTED_PROXIES": "10.0.0.0/33"}, []string{"TRUSTED_PROXIES"}},
		// Trusting every hop would let clients choose their own login IP key.
		{map[string]string{"TRUSTED_PROXIES": "0.0.0.0/0,::/0"}, []string{"TRUSTED_PROXIES"}},
		{map[string]string{"METRICS_ADDR": "127.0.0.1:notaport", "NIGHT_START": "06:00"}, []string{"METRICS_ADDR", "NIGHT_START"}},
		{map[string]string{"AUTH_SECRET": "too-short", "STATEMENT_FAIL_MODE": "ajar"}, []string{"AUTH_SECRET", "STATEMENT_FAIL_MODE"}},
		// A fleet with a random secret per replica would multiply every limit by its size.
		{map[string]string{"REDIS_URL": "redis://127.0.0.1:1"}, []string{"AUTH_SECRET"}},
		{map[string]string{"REDIS_CLUSTER_ADDRS": "127.0.0.1:1"}, []string{"AUTH_SECRET"}},
		{map[string]string{"AUTH_SECRET": "dev-only-secret-change-me-0123456789abcdef"}, []string{"AUTH_SECRET"}},
		{map[string]string{"REDIS_SENTINEL_ADDRS": "s:sentinel", "REDIS_SENTINEL_MASTER": "m", "AUTH_SECRET": testSecret}, []string{"REDIS_SENTINEL_ADDRS"}},
	} {
		addr := apitest.FreeAddr(t)
		env := map[string]string{"HTTP_ADDR": addr}
		for k, v := range tt.env {
			env[k] = v
		}
		err := run(t.Context(), []string{"api"}, config.Pairs(env), io.Discard, io.Discard)
		if err == nil {
			t.Fatalf("%v: run returned nil", tt.env)
		}
		for _, name := range tt.names {
			if !strings.Contains(err.Error(), name+":") {
				t.Errorf("%v: error does not name %s:\n%v", tt.env, name, err)
			}
		}
		if _, err := http.Get("http://" + addr + "/healthz"); err == nil {
			t.Errorf("%v: something listens on %s after a configuration error", tt.env, addr)
		}
	}
}

// demoOpening is the sum of the demo accounts' opening balances: what the books hold in all,
// whatever moved between them.
func demoOpening() int64 {
	sum := int64(0)
	accounts, _ := pix.DemoAccounts(apitest.PasswordCost) // only their balances are read
	for _, a := range accounts {
		sum += a.OpeningCents
	}
	return sum
}

// TestServesItsContract: GET /openapi.yaml is docs/openapi.yaml, byte for byte, without a token,
// cacheable, and a revalidation with its ETag costs no body.
func TestServesItsContract(t *testing.T) {
	t.Parallel()
	a := startAPI(t, redistest.Start(t), nil)
	r := a.Do(http.MethodGet, "/openapi.yaml", nil)
	if r.Status != http.StatusOK || !bytes.Equal(r.Body, pixlimit.OpenAPI) || r.Header.Get("Content-Type") != "application/yaml" ||
		!strings.Contains(r.Header.Get("Cache-Control"), "max-age") {
		t.Fatalf("GET /openapi.yaml: %d %v, want 200 with docs/openapi.yaml", r.Status, r.Header)
	}
	if again := a.Do(http.MethodGet, "/openapi.yaml", nil, "If-None-Match", r.Header.Get("ETag")); again.Status != http.StatusNotModified || len(again.Body) != 0 {
		t.Errorf("revalidated with its ETag: %d, %d bytes; want 304 and none", again.Status, len(again.Body))
	}
}

// TestMisspelledAndDeprecatedVariablesAreNamedAtStart: PIX_LIMIT_TYPO is not silently ignored:
// the replica warns at start, naming it, and serves with PIX_LIMIT's default.
// RATELIMIT_LOCAL_CACHE_SIZE, the deny cache's size under its name before wave 5, is read, with
// a warning naming it as deprecated. A raise in force an hour after it is asked is served, with a
// warning that the central bank asks 24 hours at least.
func TestMisspelledAndDeprecatedVariablesAreNamedAtStart(t *testing.T) {
	t.Parallel()
	a := startAPI(t, nil, map[string]string{"PIX_LIMIT_TYPO": "5", "RATELIMIT_LOCAL_CACHE_SIZE": "1000", "LIMIT_INCREASE_DELAY": "1h"})
	logs := a.logs.String()
	if !regexp.MustCompile(`level=WARN msg="a money rule is set apart from the central bank's[^\n]*rule="LIMIT_INCREASE_DELAY=1h0m0s: `).MatchString(logs) {
		t.Errorf("the start's logs do not warn of LIMIT_INCREASE_DELAY=1h:\n%s", logs)
	}
	warnings := map[string]bool{}
	for _, line := range strings.Split(logs, "\n") {
		for _, name := range []string{"PIX_LIMIT_TYPO", "RATELIMIT_LOCAL_CACHE_SIZE"} {
			if strings.Contains(line, "level=WARN") && strings.Contains(line, "variable="+name) {
				warnings[name] = strings.Contains(line, "deprecated")
			}
		}
	}
	if deprecated, ok := warnings["PIX_LIMIT_TYPO"]; !ok || deprecated {
		t.Errorf("the start's logs do not name PIX_LIMIT_TYPO in a warning of an unknown variable:\n%s", logs)
	}
	if deprecated := warnings["RATELIMIT_LOCAL_CACHE_SIZE"]; !deprecated ||
		!strings.Contains(logs, "use=RATELIMIT_DENY_CACHE_SIZE") {
		t.Errorf("the start's logs do not name RATELIMIT_LOCAL_CACHE_SIZE as deprecated, for RATELIMIT_DENY_CACHE_SIZE:\n%s", logs)
	}
}
