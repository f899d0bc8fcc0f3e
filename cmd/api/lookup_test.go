package main

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pixlimit/pixlimit/internal/testing/apitest"
	"github.com/pixlimit/pixlimit/internal/testing/redistest"
)

// TestKeyLookupAntiScan: across two replicas, hits cost one token and misses twenty, exactly;
// five misses empty the bucket of 100 and the next look-up is refused, hit or not; a PIX to a
// key nobody has is charged a miss too; a refused look-up and a refused transfer move nothing.
func TestKeyLookupAntiScan(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	a, b := startAPI(t, srv, nil), startAPI(t, srv, nil)
	diego := a.Token(demo[3].Document, demo[3].Password)
	lookup := func(c *api, key string) apitest.Response {
		return c.Do(http.MethodGet, "/v1/pix/keys/"+key, nil, "Authorization", "Bearer "+diego)
	}
	r := lookup(a, "+5511987654321")
	body := r.JSON(t)
	if r.Status != http.StatusOK || body["name"] != "Bruno L." || body["document"] != "***.533.447-**" || body["key"] != "+5511987654321" {
		t.Fatalf("look-up of Bruno's phone: %v, want 200 Bruno L. ***.533.447-**", r)
	}
	if got := r.Header.Get("RateLimit-Remaining"); got != "99" || r.Header.Get("RateLimit-Policy") != `"pix-lookup";q=2;w=60;pixlimit-burst=100` {
		t.Errorf("after a hit: Remaining %q, Policy %q; want 99 and the bucket", got, r.Header.Get("RateLimit-Policy"))
	}
	for i, c := range []*api{b, a, b} { // three misses, alternating replicas: 99 - 60 = 39
		r := lookup(c, fmt.Sprintf("nobody%d@example.com", i))
		if r.Status != http.StatusNotFound || r.JSON(t)["error"] != "key_not_found" {
			t.Fatalf("miss %d: %v, want 404 key_not_found", i+1, r)
		}
		if got, want := r.Header.Get("RateLimit-Remaining"), fmt.Sprint(99-20*(i+1)); got != want {
			t.Errorf("after miss %d: Remaining %s, want %s", i+1, got, want)
		}
	}
	// A PIX to a key nobody has is a miss too: 39 - 20 = 19.
	if r := a.PIX(diego, "ghost@example.com", 100); r.Status != http.StatusNotFound {
		t.Fatalf("PIX to an unknown key: %v, want 404", r)
	}
	if r := lookup(b, "nobody9@example.com"); r.Status != http.StatusNotFound || r.Header.Get("RateLimit-Remaining") != "0" {
		t.Fatalf("the fifth miss: %v, Remaining %q; want 404 and an empty bucket", r, r.Header.Get("RateLimit-Remaining"))
	}
	for _, key := range []string{"bruno@example.com", "another@example.com"} {
		r := lookup(a, key)
		if r.Status != http.StatusTooManyRequests || r.JSON(t)["error"] != "rate_limit_exceeded" || r.Header.Get("Retry-After") == "" {
			t.Errorf("look-up of %s with the bucket empty: %v, want 429 with Retry-After", key, r)
		}
	}
	if got := a.Balance(diego); got != 100_000 {
		t.Errorf("Diego's balance %d, want 100000: nothing moved", got)
	}
	// Another account's bucket is its own.
	ana := b.Token(demo[0].Document, demo[0].Password)
	if r := b.Do(http.MethodGet, "/v1/pix/keys/diego@example.com", nil, "Authorization", "Bearer "+ana); r.Status != http.StatusOK {
		t.Errorf("Ana's look-up: %v, want 200", r)
	}
	if r := a.Do(http.MethodGet, "/v1/pix/keys/not-a-key", nil, "Authorization", "Bearer "+ana); r.Status != http.StatusBadRequest {
		t.Errorf("a malformed key: %v, want 400", r)
	}
	if r := a.Do(http.MethodGet, "/v1/pix/keys/bruno@example.com", nil); r.Status != http.StatusUnauthorized {
		t.Errorf("without a token: %v, want 401", r)
	}
}

// TestPIXIsNoSideDoorAroundTheLookUpLimit: once the look-up bucket is empty, a PIX is refused
// (429, policy pix-lookup) whether its key exists or not, and the PIX's own limit records
// nothing: a PIX is not the way to ask whether a key exists that a look-up may no longer ask.
// Then 60 look-ups of unknown keys at once, over two replicas, on a full bucket: exactly 5
// answered 404, as one by one.
func TestPIXIsNoSideDoorAroundTheLookUpLimit(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	a, b := startAPI(t, srv, nil), startAPI(t, srv, nil)
	diego := a.Token(demo[3].Document, demo[3].Password)
	for i := range 5 {
		if r := a.PIX(diego, fmt.Sprintf("ghost%d@example.com", i), 100); r.Status != http.StatusNotFound {
			t.Fatalf("PIX %d to an unknown key: %v, want 404 (a miss, 20 tokens)", i+1, r)
		}
	}
	for _, key := range []string{"ghost9@example.com", "bruno@example.com"} {
		r := b.PIX(diego, key, 500_000) // more than Diego has: a found key would be 422
		if r.Status != http.StatusTooManyRequests || r.JSON(t)["error"] != "rate_limit_exceeded" ||
			!strings.HasPrefix(r.Header.Get("RateLimit-Policy"), `"pix-lookup"`) || r.Header.Get("Retry-After") == "" {
			t.Errorf("PIX to %s with the look-up bucket empty: %v %v, want 429 by pix-lookup with Retry-After", key, r, r.Header)
		}
	}
	// The two refused PIX took nothing from the PIX limit: five used, five left.
	if r := a.Statement(diego); r.Status != http.StatusOK {
		t.Fatal(r)
	}
	ana := b.Token(demo[0].Document, demo[0].Password)
	if r := a.PIX(ana, "bruno@example.com", 1); r.Header.Get("RateLimit-Remaining") != "9" || r.Status != http.StatusCreated {
		t.Errorf("Ana's PIX: %v Remaining %q, want 201 with 9 left (her own limit)", r, r.Header.Get("RateLimit-Remaining"))
	}

	carla := a.Token(demo[2].Document, demo[2].Password)
	statuses := apitest.Burst([]*apitest.Client{a.Client, b.Client}, 60, func(c *apitest.Client, i int) apitest.Response {
		return c.Do(http.MethodGet, fmt.Sprintf("/v1/pix/keys/scan%d@example.com", i), nil, "Authorization", "Bearer "+carla)
	})
	if statuses[http.StatusNotFound] != 5 || statuses[http.StatusTooManyRequests] != 55 {
		t.Errorf("60 concurrent look-ups of unknown keys: %v, want 5 × 404 and 55 × 429", statuses)
	}
}

// TestPercentEncodedKeysAreDecodedOnce: a key in the path may be percent-encoded, as a client
// library escapes @ and +; it is decoded once, then validated.
func TestPercentEncodedKeysAreDecodedOnce(t *testing.T) {
	t.Parallel()
	a := startAPI(t, redistest.Start(t), nil)
	tok := a.Token(demo[3].Document, demo[3].Password)
	for path, want := range map[string]int{
		"bruno%40example.com":   http.StatusOK,
		"%2B5511987654321":      http.StatusOK,
		"bruno@example.com":     http.StatusOK,
		"bruno%2540example.com": http.StatusBadRequest, // decoded once: bruno%40example.com is no key
	} {
		if r := a.Do(http.MethodGet, "/v1/pix/keys/"+path, nil, "Authorization", "Bearer "+tok); r.Status != want {
			t.Errorf("GET /v1/pix/keys/%s: %v, want %d", path, r, want)
		}
	}
}

// TestNightCapOverHTTP: with the night set around now, a payer is refused the transfer that
// crosses R$ 1.000,00 with 422 night_limit_exceeded, told how much is left, and nothing moves.
func TestNightCapOverHTTP(t *testing.T) {
	t.Parallel()
	sp, err := time.LoadLocation("America/Sao_Paulo")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().In(sp) // a night around now, whatever the hour the test runs at
	a := startAPI(t, redistest.Start(t), map[string]string{
		"NIGHT_LIMIT_CENTS": "100000", "NIGHT_START": now.Add(-time.Hour).Format("15:04"), "NIGHT_END": now.Add(time.Hour).Format("15:04")})
	ana := a.Token(demo[0].Document, demo[0].Password)
	if r := a.PIX(ana, "bruno@example.com", 90_000); r.Status != http.StatusCreated {
		t.Fatalf("R$ 900,00: %v, want 201", r)
	}
	r := a.PIX(ana, "bruno@example.com", 20_000)
	if r.Status != http.StatusUnprocessableEntity || r.JSON(t)["error"] != "night_limit_exceeded" ||
		!strings.Contains(r.JSON(t)["message"].(string), "R$ 100,00 left tonight") {
		t.Fatalf("R$ 200,00 more: %v, want 422 night_limit_exceeded with R$ 100,00 left", r)
	}
	if got := a.Balance(ana); got != 1_000_000-90_000 {
		t.Errorf("balance %d, want %d", got, 1_000_000-90_000)
	}
}
