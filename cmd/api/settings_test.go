package main

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pixlimit/pixlimit/internal/testing/apitest"
	"github.com/pixlimit/pixlimit/internal/testing/pgtest"
	"github.com/pixlimit/pixlimit/internal/testing/redistest"
	"github.com/pixlimit/pixlimit/internal/testing/stalls"
)

// TestASettingsFloodDoesNotStarveTheLedger: one device of Ana's floods her settings routes (PUT
// and GET /v1/limits, DELETE /v1/limits/pending, GET /v1/pix/keys/limits) from 16 clients at
// once. Past account-settings' 20 a minute for that device they are refused before the ledger,
// so Diego's PIX keeps its median within 2× of quiet, timed in the same run; "quiet" for the
// ledger, since the flood's HTTP work takes the same two cores: beside a control flood of as many
// calls that the API refuses before the ledger, each PIX timed less the stalls of the process (a
// busy machine's, or the flood's own CPU), so what differs is what the PIX waited for. Meanwhile
// the owner's other device is not refused (a bucket per device): a lowering from it goes through,
// while one from the flooding device is refused like any settings call past its bucket.
func TestASettingsFloodDoesNotStarveTheLedger(t *testing.T) {
	t.Parallel()
	env := moneyEnv(t, pgtest.URL(t), false)
	env["PIX_LIMIT"] = "1000"
	env["SETTINGS_WINDOW"] = "1h" // the rounds fit in one window however slow the machine: 20 admitted
	env["REDIS_TIMEOUT"] = "1s"   // a decision recorded but answered late (rate_limiter_unavailable) would be one of the 20
	a := startAPI(t, redistest.Start(t), env)
	phisher := a.Token(demo[0].Document, demo[0].Password) // a device of Ana's account
	owner := a.Token(demo[0].Document, demo[0].Password)   // another one: her own phone
	diego := a.Token(demo[3].Document, demo[3].Password)
	meter := stalls.Watch(t) // each PIX is timed less the stalls of the whole process: the ledger's waits remain

	// A PIX that a loaded machine's ledger could not answer within DB_TIMEOUT (503
	// ledger_unavailable: nothing changed) is sent again, as a client would, and what Diego waited
	// counts all of it; anything else fails the test, after the flood running then stops (defer).
	pix := func(n int) (took []time.Duration) {
		for range n {
			var waited time.Duration
			for try := 1; ; try++ {
				r := a.PIX(diego, "bruno@example.com", 1)
				waited += meter.Just(r.Took)
				if r.Status == http.StatusCreated {
					break
				}
				if r.Status != http.StatusServiceUnavailable || try == 3 {
					t.Fatalf("Diego's PIX, try %d: %v", try, r)
				}
				t.Logf("Diego's PIX, try %d: %v; sent again", try, r)
			}
			took = append(took, waited)
		}
		return took
	}
	median := func(took []time.Duration) time.Duration {
		slices.Sort(took)
		return took[len(took)/2]
	}
	pix(3) // connections dialed, scripts loaded
	quiet := median(pix(15))

	// flood runs send from 16 clients until the returned stop is called, which waits for them;
	// it returns once 200 calls were sent. A flood still running when the test ends (a PIX failed
	// it) is stopped before it does: its clients report to the test.
	var running []func()
	defer func() {
		for _, stop := range running {
			stop()
		}
	}()
	flood := func(send func(g, i int) apitest.Response) (stop func() (sent, refused int64)) {
		done := make(chan struct{})
		var once sync.Once
		end := func() { once.Do(func() { close(done) }) }
		var wg sync.WaitGroup
		var n, no atomic.Int64
		for g := range 16 {
			wg.Go(func() {
				for i := 0; ; i++ {
					select {
					case <-done:
						return
					default:
					}
					n.Add(1)
					if r := send(g, i); r.Status == http.StatusTooManyRequests && r.JSON(t)["error"] == "rate_limit_exceeded" {
						no.Add(1)
					}
				}
			})
		}
		for n.Load() < 200 {
			time.Sleep(10 * time.Millisecond)
		}
		running = append(running, func() { end(); wg.Wait() })
		return func() (int64, int64) { end(); wg.Wait(); return n.Load(), no.Load() }
	}
	// The control: as many calls, each authenticated and refused by the limiter before the
	// ledger (Ana's statements, past their limit), so that what the flood costs the two cores is
	// in both figures and only the ledger's part differs. Three rounds of each, alternated.
	statements := func(int, int) apitest.Response { return a.Statement(phisher) }
	settings := func(g, i int) apitest.Response {
		switch (g + i) % 4 {
		case 0:
			return a.Do(http.MethodPut, "/v1/limits", map[string]any{"day_limit_cents": 2_000_000 + g*100 + i%100}, "Authorization", "Bearer "+phisher) // a raise: counted
		case 1:
			return a.Do(http.MethodGet, "/v1/limits", nil, "Authorization", "Bearer "+phisher)
		case 2:
			return a.Do(http.MethodDelete, "/v1/limits/pending", nil, "Authorization", "Bearer "+phisher)
		}
		return a.Do(http.MethodGet, "/v1/pix/keys/limits", nil, "Authorization", "Bearer "+phisher)
	}
	var beside, during []time.Duration
	var sent, refused int64
	var lowered, floodLowered, ownRead apitest.Response
	for round := range 3 {
		stop := flood(statements)
		beside = append(beside, pix(7)...)
		stop()
		stop = flood(settings)
		during = append(during, pix(7)...)
		if round == 2 {
			floodLowered = a.Do(http.MethodPut, "/v1/limits", map[string]any{"night_limit_cents": 40_000}, "Authorization", "Bearer "+phisher)
			lowered = a.Do(http.MethodPut, "/v1/limits", map[string]any{"night_limit_cents": 50_000}, "Authorization", "Bearer "+owner)
			ownRead = a.Do(http.MethodGet, "/v1/limits", nil, "Authorization", "Bearer "+owner)
		}
		n, no := stop()
		sent, refused = sent+n, refused+no
	}
	control, flooded := median(beside), median(during)

	t.Logf("Diego's PIX: median %v quiet, %v beside a flood the limiter refuses before the ledger, %v during a flood of %d settings calls (%d refused)",
		quiet, control, flooded, sent, refused)
	if flooded > 2*max(quiet, control) {
		t.Errorf("Diego's PIX median %v during the settings flood, over twice its %v beside the same load kept off the ledger", flooded, max(quiet, control))
	}
	if n := sent - refused; n != 20 {
		t.Errorf("%d of the flooding device's settings calls were served, want account-settings' 20 exactly", n)
	}
	if lowered.Status != http.StatusOK {
		t.Errorf("a lowering from the owner's own device during the flood: %v, want 200", lowered)
	}
	if floodLowered.Status != http.StatusTooManyRequests {
		t.Errorf("a lowering from the flooding device past its bucket: %v, want 429 like every settings call", floodLowered)
	}
	if ownRead.Status != http.StatusOK {
		t.Errorf("the owner's other device during the flood: %v, want 200", ownRead)
	}
}

// TestNoAccountStarvesTheLedger: Ana floods, with clients that wait a second after a 429 or 503
// as clients do, a fixed amount of work: 300 clients lowering her day limit (account-settings
// raised to 100,000 so that the limiter lets them all through: what is left to protect the
// ledger is LEDGER_ACCOUNT_SHARE), then 200 clients removing a device she does not have. Diego's
// PIX, sent during each flood, are every one 201: none ledger_busy, none ledger_unavailable. His
// latency is logged, not judged (a timed test fails on a busy machine): the ratios to quiet, with
// and without the share, are measured in docs/benchmarks.md.
func TestNoAccountStarvesTheLedger(t *testing.T) {
	t.Parallel()
	env := moneyEnv(t, pgtest.URL(t), false)
	env["PIX_LIMIT"], env["SETTINGS_LIMIT"], env["SETTINGS_WINDOW"] = "1000", "100000", "1h"
	env["REDIS_TIMEOUT"] = "1s" // the flood's CPU is not what this test judges (DB_TIMEOUT: the default, 2s)
	a := startAPI(t, redistest.Start(t), env)
	ana := a.Token(demo[0].Document, demo[0].Password)
	diego := a.Token(demo[3].Document, demo[3].Password)
	median := func(took []time.Duration) time.Duration { slices.Sort(took); return took[len(took)/2] }
	meter := stalls.Watch(t) // each PIX timed less the process's stalls (the flood's own CPU): what it waited for
	var quiet []time.Duration
	for range 10 {
		if r := a.PIX(diego, "bruno@example.com", 1); r.Status == http.StatusCreated {
			quiet = append(quiet, meter.Just(r.Took))
		}
	}
	for _, flood := range []struct {
		name    string
		clients int
		calls   int
		send    func(i int) apitest.Response
	}{
		{"lowering the day limit", 300, 4, func(i int) apitest.Response {
			return a.Do(http.MethodPut, "/v1/limits", map[string]any{"day_limit_cents": 900_000 - i}, "Authorization", "Bearer "+ana)
		}},
		{"removing a device she does not have", 200, 12, func(int) apitest.Response {
			return a.Do(http.MethodDelete, "/v1/devices/NOPE", nil, "Authorization", "Bearer "+ana)
		}},
	} {
		var wg sync.WaitGroup
		var busy, served atomic.Int64
		for g := range flood.clients {
			wg.Go(func() {
				for i := range flood.calls {
					r := flood.send(g*100 + i)
					switch r.Status {
					case http.StatusServiceUnavailable, http.StatusTooManyRequests:
						busy.Add(1)
						time.Sleep(time.Second) // a client that waits after a 429 or 503, as clients do
					default:
						served.Add(1)
					}
				}
			})
		}
		var outcomes []string
		var took []time.Duration
		for range 10 {
			r := a.PIX(diego, "bruno@example.com", 1)
			took = append(took, meter.Just(r.Took))
			if r.Status != http.StatusCreated {
				outcomes = append(outcomes, fmt.Sprint(r))
			}
		}
		wg.Wait()
		t.Logf("%s: %d calls served, %d answered 429 or 503; Diego's PIX median %v, quiet %v (%.1f×)", flood.name,
			served.Load(), busy.Load(), median(took), median(quiet), float64(median(took))/float64(median(quiet)))
		if len(outcomes) > 0 {
			t.Errorf("Diego's PIX during Ana's flood of %s: %d of 10 not 201: %v", flood.name, len(outcomes), outcomes)
		}
	}
}

// TestARemovalCountsAgainstAccountSettings: removing a device is a settings call like the others
// (wave 5 supersedes wave 4's "never refused"): past account-settings' 3 for one device, a
// removal from it is 429 naming the policy, while another device of the account, with a bucket of
// its own, still removes (a pending one, itself).
func TestARemovalCountsAgainstAccountSettings(t *testing.T) {
	t.Parallel()
	a := startAPI(t, redistest.Start(t), map[string]string{"DEMO_ACCOUNTS": "true", "SETTINGS_LIMIT": "3", "SETTINGS_WINDOW": "1h"})
	ana := demo[0]
	register := func(token string) apitest.Response {
		return a.Do(http.MethodPost, "/v1/devices/current/register", map[string]string{"password": ana.Password}, "Authorization", "Bearer "+token)
	}
	flooder := a.Token(ana.Document, ana.Password)
	if r := register(flooder); r.Status != http.StatusOK {
		t.Fatalf("Ana's first device: %v, want 200 registered", r)
	}
	other := a.Token(ana.Document, ana.Password)
	pending := register(other)
	if pending.Status != http.StatusAccepted {
		t.Fatalf("Ana's second device: %v, want 202 pending", pending)
	}
	// A registration is a settings call: its headers are account-settings', not its guesses' key's.
	if got, want := pending.Header.Get("RateLimit-Policy"), `"account-settings";q=3;w=3600`; got != want {
		t.Errorf("a registration's RateLimit-Policy: %q, want %q", got, want)
	}
	var got []int
	var refusal apitest.Response
	for range 5 {
		r := a.Do(http.MethodDelete, "/v1/devices/NOPE", nil, "Authorization", "Bearer "+flooder)
		got = append(got, r.Status)
		if r.Status == http.StatusTooManyRequests {
			refusal = r
		}
	}
	if want := []int{404, 404, 429, 429, 429}; !slices.Equal(got, want) { // its registration was the first of 3
		t.Errorf("5 removals of a device Ana does not have, from one device: %v, want %v", got, want)
	}
	if !strings.Contains(refusal.Header.Get("RateLimit-Policy"), `"account-settings"`) || refusal.Header.Get("Retry-After") == "" {
		t.Errorf("the refused removal: %v, want account-settings in RateLimit-Policy and a Retry-After", refusal.Header)
	}
	id := pending.JSON(t)["device_id"].(string)
	if r := a.Do(http.MethodDelete, "/v1/devices/"+id, nil, "Authorization", "Bearer "+other); r.Status != http.StatusNoContent {
		t.Errorf("the pending device removing itself meanwhile: %v, want 204: one device's flood spends its own bucket", r)
	}
}

// TestABadSettingsCallCostsNoQuota: a change of limits out of range is 400 before it is counted
// against account-settings, and a registration whose body is malformed is 400 before it is
// counted as a guess of the password (login-device): neither is a call the limits are for.
func TestABadSettingsCallCostsNoQuota(t *testing.T) {
	t.Parallel()
	a := startAPI(t, redistest.Start(t), map[string]string{"DEMO_ACCOUNTS": "true", "SETTINGS_LIMIT": "10", "SETTINGS_WINDOW": "1h"})
	ana := a.Token(demo[0].Document, demo[0].Password)
	auth := []string{"Authorization", "Bearer " + ana}
	for _, body := range []map[string]any{{"night_limit_cents": -1}, {"day_limit_cents": int64(1) << 60}, {"night_start": "21:00"}, {"night_limit_cents": nil}} {
		if r := a.Do(http.MethodPut, "/v1/limits", body, auth...); r.Status != http.StatusBadRequest {
			t.Errorf("PUT /v1/limits %v: %v, want 400", body, r)
		}
	}
	both := a.Do(http.MethodPut, "/v1/limits", map[string]any{"night_limit_cents": 100000001, "night_start": "21:00"}, auth...)
	if fields, _ := both.JSON(t)["fields"].(map[string]any); both.Status != http.StatusBadRequest || len(fields) != 2 {
		t.Errorf("PUT /v1/limits with two bad values: %v, want 400 naming both", both)
	}
	r := a.Do(http.MethodPut, "/v1/limits", map[string]any{"night_limit_cents": 50000}, auth...)
	if r.Status != http.StatusOK || r.Header.Get("RateLimit-Remaining") != "9" {
		t.Errorf("a valid change after four invalid ones: %v, want 200 and 9 remaining of 10", r)
	}

	bruno := a.Token(demo[1].Document, demo[1].Password)
	for range 6 { // LOGIN_DEVICE_LIMIT is 5; each is a settings call (6 of 10)
		if r := a.Do(http.MethodPost, "/v1/devices/current/register", map[string]any{"password": nil}, "Authorization", "Bearer "+bruno); r.Status != http.StatusBadRequest {
			t.Errorf("a registration without its password: %v, want 400", r)
		}
	}
	if r := a.Do(http.MethodPost, "/v1/devices/current/register", map[string]string{"password": demo[1].Password}, "Authorization", "Bearer "+bruno); r.Status != http.StatusOK {
		t.Errorf("Bruno's first device, after six malformed registrations: %v, want 200 registered", r)
	}
}

// TestARefusedGuessSpendsNoSettings: a device registration refused by its token's guesses
// (login-device) is recorded by account-settings no more than by login-device (a 429 consumes no
// quota of any key): they decide in one decision. Before, each such 429 took a settings token.
// With the login on another algorithm than the settings (gcra), they cannot share a decision: the
// settings are decided first, and a guess refused after spends one, as documented.
func TestARefusedGuessSpendsNoSettings(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		algorithm, remaining string
	}{{"sliding_log", "8"}, {"gcra", "5"}} {
		a := startAPI(t, redistest.Start(t), map[string]string{"DEMO_ACCOUNTS": "true", "SETTINGS_LIMIT": "10", "SETTINGS_WINDOW": "1h",
			"LOGIN_DEVICE_LIMIT": "1", "LOGIN_ALGORITHM": tt.algorithm})
		ana := a.Token(demo[0].Document, demo[0].Password)
		var got []int
		for range 4 {
			r := a.Do(http.MethodPost, "/v1/devices/current/register", map[string]string{"password": "wrong"}, "Authorization", "Bearer "+ana)
			got = append(got, r.Status)
			if r.Status == http.StatusTooManyRequests && !strings.Contains(r.Header.Get("RateLimit-Policy"), `"login-device"`) {
				t.Errorf("%s: a refused guess's RateLimit-Policy %q, want login-device's", tt.algorithm, r.Header.Get("RateLimit-Policy"))
			}
		}
		if want := []int{401, 429, 429, 429}; !slices.Equal(got, want) {
			t.Fatalf("%s: 4 wrong passwords from one token: %v, want %v", tt.algorithm, got, want)
		}
		r := a.Do(http.MethodGet, "/v1/limits", nil, "Authorization", "Bearer "+ana)
		if got := r.Header.Get("RateLimit-Remaining"); r.Status != http.StatusOK || got != tt.remaining {
			t.Errorf("%s: account-settings after 1 guess answered and 3 refused, and this read: %d, Remaining %q, want 200 and %s of 10",
				tt.algorithm, r.Status, got, tt.remaining)
		}
	}
}
