package main

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/pixlimit/pixlimit/internal/testing/apitest"
	"github.com/pixlimit/pixlimit/internal/testing/redistest"
)

// lookupOf is a look-up of key by the holder of token.
func lookupOf(c *api, token, key string) apitest.Response {
	return c.Do(http.MethodGet, "/v1/pix/keys/"+key, nil, "Authorization", "Bearer "+token)
}

// bucketsOf is the payer's look-up buckets (GET /v1/pix/keys/limits): available tokens by policy.
func bucketsOf(t *testing.T, c *api, token string) map[string]float64 {
	t.Helper()
	r := c.Do(http.MethodGet, "/v1/pix/keys/limits", nil, "Authorization", "Bearer "+token)
	if r.Status != http.StatusOK {
		t.Fatalf("GET /v1/pix/keys/limits: %v", r)
	}
	out := map[string]float64{}
	policies, _ := r.JSON(t)["policies"].([]any)
	for _, p := range policies {
		m, _ := p.(map[string]any)
		out[m["name"].(string)] = m["available_tokens"].(float64)
	}
	return out
}

// TestCompaniesLogInAndArePaid: a company logs in with its CNPJ, numeric or alphanumeric, with or
// without punctuation, in either case; its CNPJ is a PIX key; its look-up shows its name and CNPJ
// in full (public in the Receita Federal's register), a person's abbreviated and masked; a CNPJ
// with a wrong check digit is 400 and counts only against the IP key.
func TestCompaniesLogInAndArePaid(t *testing.T) {
	t.Parallel()
	a := startAPI(t, redistest.Start(t), nil)
	padaria, cafe := demo[4], demo[5]
	for _, doc := range []string{padaria.Document, "11222333000181", cafe.Document, "12ABC34501DE35", "12.abc.345/01de-35"} {
		pw := padaria.Password
		if doc[3] == 'A' || doc[3] == 'a' || doc[2] == 'A' {
			pw = cafe.Password
		}
		if r := a.Login(doc, pw); r.Status != http.StatusOK {
			t.Errorf("login with %q: %v, want 200", doc, r)
		}
	}
	r := a.Login("12.ABC.345/01DE-36", cafe.Password)
	if r.Status != http.StatusBadRequest || r.JSON(t)["error"] != "invalid_request" {
		t.Errorf("a CNPJ with a wrong check digit: %v, want 400 invalid_request", r)
	}
	ana := a.Token(demo[0].Document, demo[0].Password)
	if r := a.PIX(ana, "12.abc.345/01de-35", 1500); r.Status != http.StatusCreated || r.JSON(t)["to"].(map[string]any)["key"] != "12ABC34501DE35" {
		t.Errorf("PIX to the café's CNPJ key: %v, want 201 to 12ABC34501DE35", r)
	}
	r = lookupOf(a, ana, "11222333000181")
	if body := r.JSON(t); r.Status != http.StatusOK || body["name"] != "Padaria Pão Quente Ltda" || body["document"] != "11.222.333/0001-81" {
		t.Errorf("look-up of the bakery's CNPJ: %v, want its name and CNPJ in full", r)
	}
	if got := r.Header.Get("RateLimit-Policy"); got != `"pix-lookup-v2";q=2;w=60;pixlimit-burst=100` {
		t.Errorf("a CNPJ key's look-up: RateLimit-Policy %q, want the v2 bucket", got)
	}
}

// TestLookUpBucketsAsDICTHasThem drives the DICT user buckets over two replicas: a person's hold
// 100, refilled 2 a minute, and a company's 1,000, refilled 20; e-mail and phone keys draw on
// pix-lookup, CPF, CNPJ and random keys on pix-lookup-v2, each with its own tokens; a PIX
// answered 201 after a look-up of its key gives one token back (two to a company) to the bucket
// of its key's type, never above capacity; a replayed 201 gives none, nor does a PIX no look-up
// led to; a PIX to a key nobody has costs a miss of its type's bucket.
func TestLookUpBucketsAsDICTHasThem(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	a, b := startAPI(t, srv, nil), startAPI(t, srv, nil)
	diego := a.Token(demo[3].Document, demo[3].Password)
	padaria := b.Token(demo[4].Document, demo[4].Password)

	if got := bucketsOf(t, a, diego); got["pix-lookup"] != 100 || got["pix-lookup-v2"] != 100 || len(got) != 2 {
		t.Fatalf("a person's buckets at first: %v, want 100 each", got)
	}
	r := a.Do(http.MethodGet, "/v1/pix/keys/limits", nil, "Authorization", "Bearer "+padaria)
	body := r.JSON(t)
	policies, _ := body["policies"].([]any)
	if r.Status != http.StatusOK || body["category"] != "D" || len(policies) != 2 {
		t.Fatalf("a company's buckets: %v, want category D and two policies", r)
	}
	for _, p := range policies {
		m := p.(map[string]any)
		if m["capacity"] != 1000.0 || m["available_tokens"] != 1000.0 || m["refill_tokens"] != 20.0 || m["refill_period_seconds"] != 60.0 {
			t.Errorf("a company's bucket %v: want 1000 of 1000, refilled 20 per 60 s", m)
		}
	}
	if r := lookupOf(b, padaria, "bruno@example.com"); r.Header.Get("RateLimit-Remaining") != "999" ||
		r.Header.Get("RateLimit-Policy") != `"pix-lookup";q=20;w=60;pixlimit-burst=1000` {
		t.Errorf("a company's hit: %v, want 999 left of 1000", r.Header)
	}
	lookupOf(b, padaria, "ghost@example.com") // a miss: 979
	if r := a.PIX(padaria, "bruno@example.com", 100); r.Status != http.StatusCreated {
		t.Fatalf("the bakery pays Bruno: %v", r)
	}
	if got := bucketsOf(t, a, padaria); got["pix-lookup"] != 981 {
		t.Errorf("the bakery's bucket after a look-up and its payment: %v, want 981 (two tokens back, a company's)", got["pix-lookup"])
	}

	// Diego: a hit on e-mail, two misses on phone, a miss on a random key.
	lookupOf(a, diego, "bruno@example.com")                    // pix-lookup 99
	lookupOf(b, diego, "+5511900000001")                       // 79
	lookupOf(a, diego, "+5511900000002")                       // 59
	lookupOf(b, diego, "123e4567-e89b-12d3-a456-426614174000") // pix-lookup-v2 80
	if got := bucketsOf(t, b, diego); got["pix-lookup"] != 59 || got["pix-lookup-v2"] != 80 {
		t.Fatalf("after a hit and two misses by e-mail/phone and a miss by random key: %v, want 59 and 80", got)
	}
	// A look-up then its payment costs nothing: the 201 gives the token back to its type's bucket.
	lookupOf(a, diego, "39053344705") // v2: 79
	if r := b.PIX(diego, "39053344705", 100); r.Status != http.StatusCreated {
		t.Fatalf("PIX to Bruno's CPF: %v", r)
	}
	if got := bucketsOf(t, a, diego); got["pix-lookup"] != 59 || got["pix-lookup-v2"] != 80 {
		t.Fatalf("after a look-up and its payment: %v, want 59 and 80 (the token given back)", got)
	}
	// A replayed 201 moved nothing and gives nothing back.
	key := apitest.NewIdempotencyKey()
	for range 3 {
		if r := a.PIX(diego, "bruno@example.com", 100, "Idempotency-Key", key); r.Status != http.StatusCreated {
			t.Fatalf("PIX and its replays: %v", r)
		}
	}
	if got := bucketsOf(t, a, diego); got["pix-lookup"] != 60 {
		t.Errorf("after a PIX and two replays: pix-lookup %v, want 60 (one token back, not three)", got["pix-lookup"])
	}
	// A payment no look-up led to gives nothing back: Diego never looked Carla's e-mail up.
	for range 3 {
		if r := a.PIX(diego, "carla@example.com", 1); r.Status != http.StatusCreated {
			t.Fatalf("PIX to Carla: %v", r)
		}
	}
	if got := bucketsOf(t, a, diego); got["pix-lookup"] != 60 {
		t.Errorf("after three payments to a key never looked up: pix-lookup %v, want 60 (nothing back)", got["pix-lookup"])
	}
	// A PIX to a key nobody has is charged a miss of its type's bucket: 80 - 20.
	if r := b.PIX(diego, "00000000191", 100); r.Status != http.StatusNotFound {
		t.Fatalf("PIX to a CPF nobody has: %v, want 404", r)
	}
	if got := bucketsOf(t, b, diego); got["pix-lookup"] != 60 || got["pix-lookup-v2"] != 60 {
		t.Errorf("after a PIX to a CPF nobody has: %v, want 60 and 60", got)
	}
	// Never above capacity: Ana's buckets are full, and her payments give nothing beyond.
	ana := a.Token(demo[0].Document, demo[0].Password)
	for range 3 {
		a.PIX(ana, "carla@example.com", 1)
	}
	if got := bucketsOf(t, a, ana); got["pix-lookup"] != 100 || got["pix-lookup-v2"] != 100 {
		t.Errorf("a full bucket after three payments: %v, want 100 each", got)
	}
}

// TestTheBanksOwnBucket: the participant bucket (here 10 tokens, refilled 1 a minute) is shared
// by every customer and both replicas: a miss costs it 3 and a hit 1; once empty, look-ups and
// PIX to keys are 503 lookup_capacity_exhausted with Retry-After, whoever asks, their own
// buckets untouched; a 201 PIX after a look-up of its key gives it a token back, once (a
// second payment without a look-up gives nothing). The scanner drains its own bucket first:
// five misses empty a person's bucket and cost the bank's only 15.
func TestTheBanksOwnBucket(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	env := map[string]string{"LOOKUP_PARTICIPANT_CAPACITY": "10", "LOOKUP_PARTICIPANT_REFILL_PER_MINUTE": "1"}
	a, b := startAPI(t, srv, env), startAPI(t, srv, env)
	diego := a.Token(demo[3].Document, demo[3].Password)
	ana := b.Token(demo[0].Document, demo[0].Password)
	carla := a.Token(demo[2].Document, demo[2].Password)
	if r := lookupOf(a, ana, "bruno@example.com"); r.Status != http.StatusOK { // the bank's 10 - 1 = 9
		t.Fatalf("Ana looks Bruno up: %v", r)
	}
	for i, c := range []*api{a, b} { // 2 misses: 9 - 6 = 3
		if r := lookupOf(c, diego, fmt.Sprintf("ghost%d@example.com", i)); r.Status != http.StatusNotFound {
			t.Fatalf("miss %d: %v", i+1, r)
		}
	}
	// Ana pays Bruno by e-mail: charged nothing, and its 201, her look-up's payment, gives the
	// bank's bucket a token back (3 + 1 = 4); a second payment, no look-up before it, gives none.
	for i := range 2 {
		if r := b.PIX(ana, "bruno@example.com", 100); r.Status != http.StatusCreated {
			t.Fatalf("Ana's PIX %d to Bruno: %v, want 201", i+1, r)
		}
	}
	for i := range 4 { // 4 - 1 - 1 - 1 - 1 = 0
		if r := lookupOf(b, ana, "bruno@example.com"); r.Status != http.StatusOK {
			t.Fatalf("Ana's hit %d after her payment gave the bank a token back: %v, want 200", i+1, r)
		}
	}
	for _, r := range []apitest.Response{lookupOf(a, carla, "bruno@example.com"), lookupOf(b, ana, "diego@example.com"),
		a.PIX(carla, "bruno@example.com", 100)} {
		if r.Status != http.StatusServiceUnavailable || r.JSON(t)["error"] != "lookup_capacity_exhausted" || r.Header.Get("Retry-After") == "" {
			t.Errorf("with the bank's bucket empty: %v, want 503 lookup_capacity_exhausted with Retry-After", r)
		}
	}
	if got := bucketsOf(t, a, carla); got["pix-lookup"] != 100 {
		t.Errorf("Carla's bucket after the bank refused her: %v, want 100 (untouched)", got)
	}
	if got := a.Balance(carla); got != 250_000 {
		t.Errorf("Carla's balance %d, want 250000: the refused PIX moved nothing", got)
	}
	// A PIX to a CPF key (its v2 bucket is full) is asked of the bank's bucket too; refused.
	if r := b.PIX(ana, "11144477735", 100); r.Status != http.StatusServiceUnavailable {
		t.Errorf("Ana's PIX to Carla's CPF with the bank's bucket empty: %v, want 503", r)
	}

	// Another fleet, a bigger bank: one scanner's five misses empty its own bucket and cost the
	// bank's 15 of its 4,000; the sixth is refused by the scanner's own bucket (429), not the bank's.
	srv2 := redistest.Start(t)
	c := startAPI(t, srv2, nil)
	scanner := c.Token(demo[1].Document, demo[1].Password)
	for i := range 5 {
		if r := lookupOf(c, scanner, fmt.Sprintf("scan%d@example.com", i)); r.Status != http.StatusNotFound {
			t.Fatalf("scan %d: %v", i+1, r)
		}
	}
	if r := lookupOf(c, scanner, "scan6@example.com"); r.Status != http.StatusTooManyRequests {
		t.Errorf("the sixth miss: %v, want 429 by the scanner's own bucket", r)
	}
	if r := lookupOf(c, c.Token(demo[0].Document, demo[0].Password), "bruno@example.com"); r.Status != http.StatusOK {
		t.Errorf("another customer after the scan: %v, want 200", r)
	}
	if got := srv2.Client(nil).Keys(t.Context(), "*").Val(); len(got) == 0 {
		t.Fatal("no keys in Redis after the scan")
	}
}

// TestALookUpRedisCannotChargeSaysNoLimit: with Redis refusing writes (full: maxmemory below what
// it holds), a look-up's ask, which writes nothing, is answered, and its charge is not: the
// look-up fails closed, 429 rate_limiter_unavailable, with no RateLimit headers (no decision was
// made: the ask's would say tokens remain, and their Reset would differ from Retry-After).
func TestALookUpRedisCannotChargeSaysNoLimit(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	a := startAPI(t, srv, map[string]string{"RATELIMIT_BREAKER_FAILURES": "0"})
	ana := a.Token(demo[0].Document, demo[0].Password)
	if r := lookupOf(a, ana, "bruno@example.com"); r.Status != http.StatusOK || r.Header.Get("RateLimit-Remaining") == "" {
		t.Fatalf("a look-up: %v %v, want 200 with RateLimit headers", r, r.Header)
	}
	rdb := srv.Client(nil)
	if err := rdb.ConfigSet(t.Context(), "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.ConfigSet(context.Background(), "maxmemory", "0") })
	for _, key := range []string{"bruno@example.com", "nobody@example.com"} {
		r := lookupOf(a, ana, key)
		if r.Status != http.StatusTooManyRequests || r.JSON(t)["error"] != "rate_limiter_unavailable" {
			t.Fatalf("a look-up of %s with Redis full: %v, want 429 rate_limiter_unavailable", key, r)
		}
		for _, h := range []string{"RateLimit", "RateLimit-Policy", "RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"} {
			if v := r.Header.Get(h); v != "" {
				t.Errorf("a look-up of %s with Redis full: %s: %q, want none (no decision was made)", key, h, v)
			}
		}
	}
}
