package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/pixlimit/pixlimit/internal/testing/apitest"
	"github.com/pixlimit/pixlimit/internal/testing/redistest"
)

func noEnv(string) string { return "" }

// runFast is run, but a self-contained fleet's passwords are hashed at the tests' least cost
// (apitest.PasswordCost): the stories show no bcrypt, and at a real deployment's cost the race
// detector makes each login take more than a second of CPU.
func runFast(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	o.passwordCost = apitest.PasswordCost
	return play(ctx, o, noEnv, stdout, stderr)
}

// TestSelfContained is `go run ./cmd/demo` with -json: every expectation of the three stories
// holds, and the results parse.
func TestSelfContained(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	if err := runFast(context.Background(), []string{"demo", "-json"}, &stdout, &stderr); err != nil {
		t.Fatalf("demo: %v\n%s", err, stderr.String())
	}
	var report struct {
		OK      bool     `json:"ok"`
		Results []result `json:"results"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &report); err != nil {
		t.Fatalf("-json output: %v\n%s", err, stdout.String())
	}
	scenarios := map[string]int{}
	for _, r := range report.Results {
		scenarios[r.Scenario]++
	}
	if !report.OK || scenarios["burst"] < 5 || scenarios["login"] < 4 || scenarios["outage"] < 5 || scenarios["hole"] < 5 {
		t.Errorf("report ok=%v with %v expectations per scenario", report.OK, scenarios)
	}
	if !strings.Contains(stderr.String(), fmt.Sprintf("All %d expectations held.", len(report.Results))) {
		t.Errorf("narration does not end with the verdict:\n%s", stderr.String())
	}
	if strings.Contains(stderr.String(), "\x1b[") {
		t.Error("colour codes written to a non-terminal")
	}
	// A PIX sent alone is drawn with its calls: its buckets and its limit in one, then the
	// buckets settled.
	if !regexp.MustCompile(`POST /v1/pix .* 201 .*redis calls 2\n`).MatchString(stderr.String()) {
		t.Errorf("no PIX answered 201 after 2 Redis calls in the narration:\n%s", stderr.String())
	}
}

// TestTargetWithRedis drives a fleet the way users drive docker compose: -target the replicas,
// -redis their Redis, which the demo pauses for the outage (CLIENT PAUSE) and clears first.
func TestTargetWithRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	f, err := startFleet(io.Discard, map[string]string{
		"PIX_WINDOW": "3s", "STATEMENT_WINDOW": "3s", "LOGIN_WINDOW": "60s", "TRUSTED_PROXIES": "127.0.0.1/32",
		"FAIL_CLOSED_RETRY_AFTER": "2s", "REDIS_TIMEOUT": "300ms", // three requests wait it out within the 4s pause
	}, srv.Addr(), apitest.PasswordCost)
	if err != nil {
		t.Fatal(err)
	}
	defer f.close()
	args := []string{"demo", "-target", strings.Join(f.urls, ","), "-redis", "redis://" + srv.Addr()}
	for run1 := range 2 { // twice: the second run must not inherit the first one's blocks
		var out bytes.Buffer
		if err := run(context.Background(), args, noEnv, &out, &out); err != nil {
			t.Fatalf("run %d: %v\n%s", run1+1, err, out.String())
		}
	}
}

// against runs the demo with args (after -target) against a fleet of its own, configured by env,
// over a Redis of its own, and returns what it printed and its error.
func against(t *testing.T, env map[string]string, args ...string) (string, error) {
	t.Helper()
	srv := redistest.Start(t)
	env["REDIS_TIMEOUT"] = "1s"
	f, err := startFleet(io.Discard, env, srv.Addr(), apitest.PasswordCost)
	if err != nil {
		t.Fatal(err)
	}
	defer f.close()
	var out bytes.Buffer
	err = run(context.Background(), append([]string{"demo", "-target", strings.Join(f.urls, ",")}, args...), noEnv, &out, &out)
	return out.String(), err
}

// TestTheScanFollowsTheMissCost: the scan story reads its target's price of a miss, however
// many misses the bucket then pays for (5 tokens: 20 misses, past a fixed dozen probes).
func TestTheScanFollowsTheMissCost(t *testing.T) {
	t.Parallel()
	out, err := against(t, map[string]string{"LOOKUP_MISS_COST": "5", "TRUSTED_PROXIES": "127.0.0.1/32"}, "-scenario", "scan")
	if err != nil {
		t.Fatalf("the scan against LOOKUP_MISS_COST=5: %v\n%s", err, out)
	}
	if !strings.Contains(out, "each miss costs 5 tokens, and the scanner is stopped after 20 misses") {
		t.Errorf("the scan's expectation does not name the target's price:\n%s", out)
	}
}

// TestAnUntrustedDemoSaysWhy: against a fleet that does not believe the demo's X-Forwarded-For
// (no TRUSTED_PROXIES), the login story fails naming the setting, not the botnet's counts.
func TestAnUntrustedDemoSaysWhy(t *testing.T) {
	t.Parallel()
	out, err := against(t, map[string]string{}, "-scenario", "login")
	if !errors.Is(err, errFailed) || !strings.Contains(out, "FAIL  login   the deployment takes the demo's X-Forwarded-For as the client (TRUSTED_PROXIES covers it)") {
		t.Errorf("the login story against a fleet without TRUSTED_PROXIES: %v, want a failure naming the setting\n%s", err, out)
	}
}

// TestGenerousLimitsFail checks the demo is a check, not a script of prints: against a fleet
// whose PIX limit is 1000, it exits with an error and names the expectation that failed.
func TestGenerousLimitsFail(t *testing.T) {
	t.Parallel()
	out, err := against(t, map[string]string{"PIX_LIMIT": "1000", "TRUSTED_PROXIES": "127.0.0.1/32"}, "-scenario", "burst")
	if !errors.Is(err, errFailed) {
		t.Fatalf("demo against PIX_LIMIT=1000: %v, want errFailed\n%s", err, out)
	}
	if !strings.Contains(out, "FAIL  burst   the PIX limit is small enough to show a burst (at most 50)") {
		t.Errorf("the failed expectation is not named:\n%s", out)
	}
}

// TestNothingCheckedIsNoSuccess: against a target, the support story is skipped (the desk is the
// deployment's), the outage without -redis (it pauses the deployment's Redis) and the 2× hole
// (it plays on a Redis of its own: it passed against a target it never reached); a run that
// checked nothing fails, and its JSON names what was skipped and why.
func TestNothingCheckedIsNoSuccess(t *testing.T) {
	t.Parallel()
	var out, narration bytes.Buffer
	err := run(context.Background(), []string{"demo", "-target", "http://localhost:1", "-scenario", "support,outage,hole", "-json"}, noEnv, &out, &narration)
	if !errors.Is(err, errFailed) {
		t.Fatalf("a run whose one story was skipped: %v, want errFailed\n%s", err, narration.String())
	}
	var got struct {
		OK      bool             `json:"ok"`
		Skipped []map[string]any `json:"skipped"`
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("-json: %v\n%s", err, out.String())
	}
	var names []any
	for _, s := range got.Skipped {
		names = append(names, s["scenario"])
	}
	if got.OK || !slices.Equal(names, []any{"support", "outage", "hole"}) {
		t.Errorf("-json: %s, want ok false and the support, outage and hole stories skipped", out.String())
	}
}

func TestBadFlags(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"demo", "-scenario", "nope"},
		{"demo", "-redis", "redis://localhost:1"},
		{"demo", "-target", ","},                     // no replica (a division by zero once)
		{"demo", "-target", "localhost:8080"},        // no scheme
		{"demo", "-target", "http://localhost:1/v1"}, // a path
		{"demo", "-target", "http://localhost:1#x"},  // a fragment: every request to /
		{"demo", "-target", "http://localhost:1?"},   // an empty query: POST /?/v1/login
		{"demo", "-target", "http://u:hunter2@localhost:1"},
		{"demo", "-target", "http://localhost:1", "-redis", "redis://192.0.2.1:6379"}, // not this machine's: the demo clears it
		{"demo", "-target", "http://localhost:1", "-redis", "redis://:hunter2@127.0.0.1:x/0"},
		{"demo", "extra"},
	} {
		var out strings.Builder
		if err := run(context.Background(), args, noEnv, &out, &out); err == nil || errors.Is(err, errFailed) ||
			strings.Contains(err.Error()+out.String(), "hunter2") {
			t.Errorf("%q: %v, want a usage error that names no password", args, err)
		}
	}
}

// TestWhoSends: the page labels a key by whose it is: a login's document, else the account its
// access token names, else nobody.
func TestWhoSends(t *testing.T) {
	payload := base64.RawURLEncoding.EncodeToString([]byte(`{"sub":"acct-ana","exp":1}`))
	for _, tc := range []struct {
		token string
		body  any
		want  string
	}{
		{"", map[string]string{"document": "529.982.247-25", "password": "x"}, "529.982.247-25"},
		{"h." + payload + ".s", nil, "acct-ana"},
		{"h." + payload + ".s", map[string]string{"key": "ana@example.com"}, "acct-ana"},
		{"not-a-token", nil, ""},
		{"h.!!!.s", nil, ""},
		{"", nil, ""},
	} {
		if got := whoSends(tc.token, tc.body); got != tc.want {
			t.Errorf("whoSends(%q, %v) = %q, want %q", tc.token, tc.body, got, tc.want)
		}
	}
}

// TestTheEveningFollowsItsTarget: against a deployment whose new-device cap and delays are not the
// demo fleet's (R$ 300,00, two hours), the evening story holds: it checks what the deployment
// refuses and postpones, not the demo's own figures.
func TestTheEveningFollowsItsTarget(t *testing.T) {
	t.Parallel()
	out, err := against(t, map[string]string{"TRUSTED_PROXIES": "127.0.0.1/32", "NEW_DEVICE_TRANSFER_LIMIT_CENTS": "30000",
		"LIMIT_INCREASE_DELAY": "2h", "DEVICE_REGISTRATION_DELAY": "2h"}, "-scenario", "evening")
	if err != nil {
		t.Fatalf("the evening against another cap and delays: %v\n%s", err, out)
	}
}
