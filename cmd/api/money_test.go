package main

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/pixlimit/pixlimit/internal/testing/apitest"
	"github.com/pixlimit/pixlimit/internal/testing/pgtest"
	"github.com/pixlimit/pixlimit/internal/testing/redistest"
)

// moneyEnv switches the money limits on, over one PostgreSQL ledger that both replicas share,
// with the night around now in São Paulo when nightNow (else the default, 20:00 to 06:00).
func moneyEnv(t *testing.T, db string, nightNow bool) map[string]string {
	t.Helper()
	env := map[string]string{
		"DATABASE_URL": db, "DEMO_ACCOUNTS": "true",
		"NIGHT_LIMIT_CENTS": "100000", "DAY_LIMIT_CENTS": "1000000",
		"NEW_DEVICE_TRANSFER_LIMIT_CENTS": "20000", "NEW_DEVICE_DAY_LIMIT_CENTS": "100000", "LIMIT_INCREASE_DELAY": "24h",
	}
	if nightNow {
		sp, err := time.LoadLocation("America/Sao_Paulo")
		if err != nil {
			t.Fatal(err)
		}
		now := time.Now().In(sp)
		env["NIGHT_START"], env["NIGHT_END"] = now.Add(-time.Hour).Format("15:04"), now.Add(time.Hour).Format("15:04")
	}
	return env
}

// TestLimitsRoutes, over two replicas on one PostgreSQL ledger: GET shows the defaults; a lower value applies at once, a higher one is
// pending for LIMIT_INCREASE_DELAY, DELETE cancels it; bad values are 400 naming each field and
// change nothing; the routes need a token.
func TestLimitsRoutes(t *testing.T) {
	t.Parallel()
	srv, db := redistest.Start(t), pgtest.URL(t)
	a, b := startAPI(t, srv, moneyEnv(t, db, false)), startAPI(t, srv, moneyEnv(t, db, false))
	ana := a.Token(demo[0].Document, demo[0].Password)
	auth := []string{"Authorization", "Bearer " + ana}
	get := func(c *api) map[string]any {
		t.Helper()
		r := c.Do(http.MethodGet, "/v1/limits", nil, auth...)
		if r.Status != http.StatusOK {
			t.Fatalf("GET /v1/limits: %v", r)
		}
		return r.JSON(t)
	}
	start := get(a)["night_start"]
	if got := get(a); got["night_limit_cents"] != 100000.0 || got["day_limit_cents"] != 1000000.0 || len(got["pending"].([]any)) != 0 {
		t.Fatalf("the defaults: %v", got)
	}
	r := b.Do(http.MethodPut, "/v1/limits", map[string]any{"night_limit_cents": 50000}, auth...)
	if body := r.JSON(t); r.Status != http.StatusOK || body["night_limit_cents"] != 50000.0 {
		t.Fatalf("lowering: %v, want R$ 500,00 at once", r)
	}
	before := time.Now()
	r = a.Do(http.MethodPut, "/v1/limits", map[string]any{"day_limit_cents": 2000000, "night_start": "22:00"}, auth...)
	body := r.JSON(t)
	pending, _ := body["pending"].([]any)
	if r.Status != http.StatusOK || body["day_limit_cents"] != 1000000.0 || len(pending) != 2 {
		t.Fatalf("raising the day limit and a later night: %v, want both pending", r)
	}
	for _, p := range pending {
		m := p.(map[string]any)
		at, err := time.Parse(time.RFC3339Nano, m["effective_at"].(string))
		if err != nil || at.Before(before.Add(24*time.Hour-time.Second)) || at.After(time.Now().Add(24*time.Hour+time.Second)) {
			t.Errorf("pending %v: effective_at %v, want 24 h from now", m, at)
		}
		switch m["field"] {
		case "day_limit_cents":
			if m["value_cents"] != 2000000.0 {
				t.Errorf("pending day limit: %v", m)
			}
		case "night_start":
			if m["value"] != "22:00" {
				t.Errorf("pending night start: %v", m)
			}
		default:
			t.Errorf("pending %v: an unexpected field", m)
		}
	}
	if got := get(b); len(got["pending"].([]any)) != 2 || got["night_start"] != start {
		t.Errorf("from the other replica: %v, want the same two pending and the night start unchanged", got)
	}
	if r := b.Do(http.MethodDelete, "/v1/limits/pending", nil, auth...); r.Status != http.StatusOK || len(r.JSON(t)["pending"].([]any)) != 0 {
		t.Errorf("cancelling: %v", r)
	}
	for _, bad := range []map[string]any{
		{"night_limit_cents": -1}, {"day_limit_cents": 100000001}, {"night_start": "21:00"}, {},
		{"night_limit_cents": 1, "day_limit_cents": -5}, {"pending": []any{}}, {"night_limit_cents": 1.5},
	} {
		r := a.Do(http.MethodPut, "/v1/limits", bad, auth...)
		if r.Status != http.StatusBadRequest || r.JSON(t)["error"] != "invalid_request" {
			t.Errorf("PUT %v: %v, want 400 invalid_request", bad, r)
		}
	}
	if got := get(a); got["night_limit_cents"] != 50000.0 || got["day_limit_cents"] != 1000000.0 || len(got["pending"].([]any)) != 0 {
		t.Errorf("after bad requests: %v, want nothing changed", got)
	}
	for _, m := range []string{http.MethodGet, http.MethodPut, http.MethodDelete} {
		path := "/v1/limits"
		if m == http.MethodDelete {
			path += "/pending"
		}
		if r := a.Do(m, path, map[string]any{"night_limit_cents": 1}); r.Status != http.StatusUnauthorized {
			t.Errorf("%s %s without a token: %v, want 401", m, path, r)
		}
	}
}

// TestNewDeviceAndItsRegistration over two replicas on one PostgreSQL ledger: a login from a new device may send R$ 200,00
// at most (422 device_limit_exceeded, with what is left); a wrong password does not register it;
// the right one does, on one replica, and the other replica lets it pay; a later login on that
// device (its device token) stays registered. At night, a payment to a company passes the cap
// between persons, and one to a person does not.
func TestNewDeviceAndItsRegistration(t *testing.T) {
	t.Parallel()
	srv, db := redistest.Start(t), pgtest.URL(t)
	a, b := startAPI(t, srv, moneyEnv(t, db, true)), startAPI(t, srv, moneyEnv(t, db, true))
	login := a.Login(demo[1].Document, demo[1].Password)
	body := login.JSON(t)
	bruno, device := body["access_token"].(string), body["device_token"].(string)
	r := b.PIX(bruno, "padaria@example.com", 30_000)
	if got := r.JSON(t); r.Status != http.StatusUnprocessableEntity || got["error"] != "device_limit_exceeded" || got["remaining_cents"] != 20000.0 {
		t.Fatalf("R$ 300,00 from a new device: %v, want 422 device_limit_exceeded with 20000 left", r)
	}
	register := func(c *api, token, password string) apitest.Response {
		return c.Do(http.MethodPost, "/v1/devices/current/register", map[string]string{"password": password}, "Authorization", "Bearer "+token)
	}
	if r := register(a, bruno, "wrong-password"); r.Status != http.StatusUnauthorized || r.JSON(t)["error"] != "invalid_credentials" {
		t.Fatalf("registering with a wrong password: %v, want 401 invalid_credentials", r)
	}
	if r := b.PIX(bruno, "padaria@example.com", 30_000); r.Status != http.StatusUnprocessableEntity {
		t.Fatalf("after a failed registration: %v, want still capped", r)
	}
	if r := register(a, bruno, demo[1].Password); r.Status != http.StatusOK || r.JSON(t)["registered"] != true {
		t.Fatalf("registering: %v", r)
	}
	// Night (the env sets it around now): R$ 1.500,00 to the bakery passes, being PF to PJ.
	if r := b.PIX(bruno, "padaria@example.com", 150_000); r.Status != http.StatusCreated {
		t.Fatalf("R$ 1.500,00 to a company at night from the registered device: %v, want 201", r)
	}
	if r := b.PIX(bruno, "ana@example.com", 100_001); r.Status != http.StatusUnprocessableEntity || r.JSON(t)["error"] != "night_limit_exceeded" {
		t.Fatalf("R$ 1.000,01 to a person at night: %v, want 422 night_limit_exceeded", r)
	}
	again := a.Login(demo[1].Document, demo[1].Password, "Device-Token", device).JSON(t)["access_token"].(string)
	if r := a.PIX(again, "ana@example.com", 30_000); r.Status != http.StatusCreated {
		t.Errorf("R$ 300,00 after logging in again on the registered device: %v, want 201", r)
	}
	other := b.Token(demo[1].Document, demo[1].Password) // another device: new again
	if r := a.PIX(other, "ana@example.com", 30_000); r.Status != http.StatusUnprocessableEntity || r.JSON(t)["error"] != "device_limit_exceeded" {
		t.Errorf("from another new device: %v, want 422 device_limit_exceeded", r)
	}
	if r := a.Do(http.MethodPost, "/v1/devices/current/register", map[string]string{"password": demo[1].Password}); r.Status != http.StatusUnauthorized {
		t.Errorf("registering without a token: %v, want 401", r)
	}
}

// TestAPhishedPasswordCannotRegisterAPhone, over two replicas on one PostgreSQL ledger: Bruno's
// phone registers at once (his first device). A phisher logs in with his password on a phone of
// its own and registers it: 202, pending a day, still capped as a new device, and able neither
// to approve itself nor to remove Bruno's phone (403 device_not_registered). Bruno sees it in
// GET /v1/devices and removes it: its token is refused (401) on both replicas. A laptop Bruno
// logs in on is approved at once by his phone. And 40 wrong-password registrations with a stolen
// token leave Bruno, logging in again, able to register.
func TestAPhishedPasswordCannotRegisterAPhone(t *testing.T) {
	t.Parallel()
	env := moneyEnv(t, pgtest.URL(t), false)
	env["TRUSTED_PROXIES"] = "127.0.0.1/32"
	srv := redistest.Start(t)
	a, b := startAPI(t, srv, env), startAPI(t, srv, env)
	bruno := demo[1]
	auth := func(token string) []string { return []string{"Authorization", "Bearer " + token} }
	register := func(c *api, token string) apitest.Response {
		return c.Do(http.MethodPost, "/v1/devices/current/register", map[string]string{"password": bruno.Password}, auth(token)...)
	}
	phone := a.Token(bruno.Document, bruno.Password, "X-Forwarded-For", "198.51.100.1")
	if r := register(a, phone); r.Status != http.StatusOK || r.JSON(t)["registered"] != true {
		t.Fatalf("Bruno's first device: %v, want 200 registered", r)
	}
	phisher := b.Token(bruno.Document, bruno.Password, "X-Forwarded-For", "203.0.113.66")
	r := register(b, phisher)
	body := r.JSON(t)
	until, _ := time.Parse(time.RFC3339Nano, fmt.Sprint(body["pending_until"]))
	if r.Status != http.StatusAccepted || body["registered"] != false || time.Until(until) < 23*time.Hour {
		t.Fatalf("the phisher's phone with Bruno's password: %v, want 202 pending a day", r)
	}
	phisherID := body["device_id"].(string)
	if r := a.PIX(phisher, "ana@example.com", 30_000); r.Status != http.StatusUnprocessableEntity || r.JSON(t)["error"] != "device_limit_exceeded" {
		t.Errorf("R$ 300,00 from the pending phone: %v, want the new-device cap", r)
	}
	if r := a.Do(http.MethodPost, "/v1/devices/"+phisherID+"/approve", nil, auth(phisher)...); r.Status != http.StatusForbidden ||
		r.JSON(t)["error"] != "device_not_registered" {
		t.Errorf("the pending phone approving itself: %v, want 403 device_not_registered", r)
	}
	list := b.Do(http.MethodGet, "/v1/devices", nil, auth(phone)...)
	devices, _ := list.JSON(t)["devices"].([]any)
	phoneID := ""
	for _, d := range devices {
		if m := d.(map[string]any); m["current"] == true {
			phoneID = m["device_id"].(string)
		}
	}
	if list.Status != http.StatusOK || len(devices) != 2 || phoneID == "" {
		t.Fatalf("Bruno's devices: %v, want his phone (current) and the pending one", list)
	}
	for _, d := range devices {
		if m := d.(map[string]any); m["device_id"] == phisherID && m["pending_until"] != body["pending_until"] {
			t.Errorf("the pending phone's pending_until: %v in the list, %v in its registration's answer; want one instant", m["pending_until"], body["pending_until"])
		}
	}
	if r := a.Do(http.MethodDelete, "/v1/devices/"+phoneID, nil, auth(phisher)...); r.Status != http.StatusForbidden {
		t.Errorf("the pending phone removing Bruno's: %v, want 403", r)
	}
	if r := a.Do(http.MethodDelete, "/v1/devices/"+phisherID, nil, auth(phone)...); r.Status != http.StatusNoContent {
		t.Fatalf("Bruno removing the phisher's phone: %v, want 204", r)
	}
	for _, c := range []*api{a, b} { // the other replica within its polling interval
		var last apitest.Response
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			// The removed phone's own settings bucket pays for the poll, not Bruno's statements.
			if last = c.Do(http.MethodGet, "/v1/limits", nil, auth(phisher)...); last.Status == http.StatusUnauthorized {
				break
			}
		}
		if last.Status != http.StatusUnauthorized {
			t.Errorf("the removed phone's token: %v, want 401", last)
		}
		if r := c.Statement(phisher); r.Status != http.StatusUnauthorized {
			t.Errorf("the removed phone's statement: %v, want 401", r)
		}
	}
	laptop := a.Token(bruno.Document, bruno.Password, "X-Forwarded-For", "198.51.100.2")
	laptopID := register(a, laptop).JSON(t)["device_id"].(string)
	if r := b.Do(http.MethodPost, "/v1/devices/"+laptopID+"/approve", nil, auth(phone)...); r.Status != http.StatusOK {
		t.Errorf("the phone approving the laptop: %v, want 200", r)
	}
	if r := b.PIX(laptop, "ana@example.com", 30_000); r.Status != http.StatusCreated {
		t.Errorf("R$ 300,00 from the approved laptop: %v, want 201", r)
	}

	// A stolen token's guesses count against that token, not against the owner's next login.
	stolen := a.Token(bruno.Document, bruno.Password, "X-Forwarded-For", "198.51.100.3")
	refused := 0
	for range 40 {
		r := a.Do(http.MethodPost, "/v1/devices/current/register", map[string]string{"password": "guess"}, auth(stolen)...)
		if r.Status == http.StatusTooManyRequests {
			refused++
		}
	}
	if refused == 0 {
		t.Error("40 wrong-password registrations with one token: none refused")
	}
	again := a.Token(bruno.Document, bruno.Password, "X-Forwarded-For", "198.51.100.3")
	if r := register(a, again); r.Status != http.StatusAccepted {
		t.Errorf("Bruno's registration after a stolen token's 40 guesses, logged in again: %v, want 202 (pending: he has a phone)", r)
	}
}
