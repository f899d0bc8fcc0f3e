package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pixlimit/pixlimit/internal/testing/apitest"
	"github.com/pixlimit/pixlimit/internal/testing/pgtest"
	"github.com/pixlimit/pixlimit/internal/testing/redistest"
)

// TestSupportDeskUnblocksCarla: a botnet fills Carla's document key; her login is refused on both
// replicas (each then holds the key as full in memory). Support reads the key's state on one
// replica's desk and clears it there: Carla logs in at once through both. A missing or wrong
// admin token is 401; every call, those included, is audited in PostgreSQL without her CPF in
// clear; and no admin route answers on the public listener.
func TestSupportDeskUnblocksCarla(t *testing.T) {
	t.Parallel()
	srv, db := redistest.Start(t), pgtest.URL(t)
	adminToken := rand.Text() + rand.Text() // never a published one: config.Load refuses those
	env := func() map[string]string {
		return map[string]string{"DATABASE_URL": db, "DEMO_ACCOUNTS": "true", "TRUSTED_PROXIES": "127.0.0.1/32",
			"ADMIN_ADDR": apitest.FreeAddr(t), "ADMIN_TOKEN": adminToken}
	}
	envA, envB := env(), env()
	a, b := startAPI(t, srv, envA), startAPI(t, srv, envB)
	deskA := &apitest.Client{T: t, Base: "http://" + envA["ADMIN_ADDR"]}
	carla := demo[2]
	for i := range 5 { // the botnet: five wrong passwords from five addresses
		c := []*api{a, b}[i%2]
		if r := c.Login(carla.Document, "wrong", "X-Forwarded-For", fmt.Sprintf("198.51.100.%d", i+1)); r.Status != http.StatusUnauthorized {
			t.Fatalf("botnet guess %d: %v", i+1, r)
		}
	}
	for _, c := range []*api{a, b, a, b} {
		if r := c.Login(carla.Document, carla.Password, "X-Forwarded-For", "203.0.113.50"); r.Status != http.StatusTooManyRequests {
			t.Fatalf("Carla during the attack: %v, want 429", r)
		}
	}
	admin := func(c *apitest.Client, method, path string, headers ...string) apitest.Response {
		return c.Do(method, path, nil, append([]string{"Authorization", "Bearer " + adminToken, "Admin-Agent", "joana.support"}, headers...)...)
	}
	path := "/admin/v1/keys/login-account/111.444.777-35"
	r := admin(deskA, http.MethodGet, path)
	if body := r.JSON(t); r.Status != http.StatusOK || body["full"] != true || body["remaining"] != 0.0 || body["limit"] != 5.0 ||
		!strings.HasPrefix(body["key"].(string), "rl:login-account:{") {
		t.Fatalf("the desk's view of Carla's key: %v", r)
	}
	r = admin(deskA, http.MethodDelete, path)
	if body := r.JSON(t); r.Status != http.StatusOK || body["after"].(map[string]any)["remaining"] != 5.0 {
		t.Fatalf("clearing Carla's key: %v", r)
	}
	// At once through both replicas: b held the key as full in its deny cache; the desk's forget
	// reaches it on the fleet's channel within a round trip (the heartbeat, each second, would be
	// the backstop): allow 200 ms.
	if r := a.Login(carla.Document, carla.Password, "X-Forwarded-For", "203.0.113.50"); r.Status != http.StatusOK {
		t.Fatalf("Carla on the desk's replica after support cleared her key: %v, want 200", r)
	}
	ok := false
	for range 10 {
		r := b.Login(carla.Document, carla.Password, "X-Forwarded-For", "203.0.113.51")
		if r.Status == http.StatusOK {
			ok = true
			break
		}
		if r.Status != http.StatusTooManyRequests {
			t.Fatalf("Carla on the other replica: %v", r)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !ok {
		t.Fatal("Carla still refused on the other replica 200 ms after support cleared her key")
	}

	for _, bad := range [][]string{nil, {"Authorization", "Bearer " + adminToken + "x"}, {"Authorization", "Basic " + adminToken}} {
		r := deskA.Do(http.MethodGet, path, nil, bad...)
		if r.Status != http.StatusUnauthorized || r.JSON(t)["error"] != "unauthorized" {
			t.Errorf("the desk with %v: %v, want 401", bad, r)
		}
	}
	if r := admin(deskA, http.MethodGet, "/admin/v1/keys/no-such-policy/x"); r.Status != http.StatusNotFound {
		t.Errorf("an unknown policy: %v, want 404", r)
	}
	if r := admin(deskA, http.MethodGet, "/admin/v1/keys/login-account/not-a-cpf"); r.Status != http.StatusBadRequest {
		t.Errorf("a bad identity: %v, want 400", r)
	}
	for _, c := range []*api{a, b} {
		for _, m := range []string{http.MethodGet, http.MethodDelete} {
			if r := c.Do(m, path, nil, "Authorization", "Bearer "+adminToken); r.Status != http.StatusNotFound {
				t.Errorf("%s %s on the public listener: %v, want 404", m, path, r)
			}
		}
	}

	conn, err := pgx.Connect(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(context.Background(), "SELECT actor, action, status, policy, key, before, after, outcome FROM admin_audit ORDER BY seq")
	if err != nil {
		t.Fatal(err)
	}
	var trail []string
	for rows.Next() {
		var actor, action, policy, key, before, after, outcome string
		var status int
		if err := rows.Scan(&actor, &action, &status, &policy, &key, &before, &after, &outcome); err != nil {
			t.Fatal(err)
		}
		line := fmt.Sprintf("%s|%s|%d|%s|%s|%s|%s", actor, action, status, policy, key, before, after)
		if strings.Contains(line, "11144477735") || strings.Contains(line, "111.444.777-35") {
			t.Errorf("an audit record holds Carla's CPF in clear: %s", line)
		}
		trail = append(trail, fmt.Sprintf("%s %s %d %s", strings.Fields(actor)[0][:5], action, status, outcome))
	}
	// The change recorded before it was made and after; the calls without the right token are
	// summarized when their minute ends (TestTheDeskSummarizesCallsWithoutTheToken), not here.
	want := []string{
		"token GET /admin/v1/keys/:policy/:identity 200 done",
		"token DELETE /admin/v1/keys/:policy/:identity 0 requested", "token DELETE /admin/v1/keys/:policy/:identity 200 done",
		"token GET /admin/v1/keys/:policy/:identity 404 failed", "token GET /admin/v1/keys/:policy/:identity 400 failed",
	}
	if fmt.Sprint(trail) != fmt.Sprint(want) {
		t.Errorf("audit trail:\n%s\nwant:\n%s", strings.Join(trail, "\n"), strings.Join(want, "\n"))
	}
	if logs := a.logs.String(); strings.Contains(logs, "11144477735") {
		t.Error("the log holds Carla's CPF")
	}
}

// TestSupportRevokesAStolenPhone: Carla's phone, a trusted device registered for PIX, is stolen
// while a botnet holds her document key full. Support revokes her devices: on both replicas
// the phone's access token is refused, its device token no longer lets a login past the full
// document key, and its registration for PIX is gone; the audit names the account by hash only.
func TestSupportRevokesAStolenPhone(t *testing.T) {
	t.Parallel()
	srv, db := redistest.Start(t), pgtest.URL(t)
	adminToken := rand.Text() + rand.Text()
	env := func() map[string]string {
		e := moneyEnv(t, db, false)
		e["TRUSTED_PROXIES"], e["ADMIN_ADDR"], e["ADMIN_TOKEN"] = "127.0.0.1/32", apitest.FreeAddr(t), adminToken
		return e
	}
	envA := env()
	a, b := startAPI(t, srv, envA), startAPI(t, srv, env())
	desk := &apitest.Client{T: t, Base: "http://" + envA["ADMIN_ADDR"]}
	carla := demo[2]

	login := a.Login(carla.Document, carla.Password, "X-Forwarded-For", "203.0.113.60")
	body := login.JSON(t)
	phone, device, id := body["access_token"].(string), body["device_token"].(string), body["account_id"].(string)
	if r := b.Do(http.MethodPost, "/v1/devices/current/register", map[string]string{"password": carla.Password}, "Authorization", "Bearer "+phone); r.Status != http.StatusOK {
		t.Fatalf("registering the phone: %v", r)
	}
	for i := range 5 { // the botnet fills her document key (her own login took one place)
		r := []*api{a, b}[i%2].Login(carla.Document, "wrong", "X-Forwarded-For", fmt.Sprintf("198.51.100.%d", i+1))
		if want := map[bool]int{true: http.StatusUnauthorized, false: http.StatusTooManyRequests}[i < 4]; r.Status != want {
			t.Fatalf("botnet guess %d: %v, want %d", i+1, r, want)
		}
	}
	if r := b.Login(carla.Document, carla.Password, "X-Forwarded-For", "203.0.113.61", "Device-Token", device); r.Status != http.StatusOK {
		t.Fatalf("the trusted phone during the attack, before the revocation: %v, want 200", r)
	}

	r := desk.Do(http.MethodDelete, "/admin/v1/accounts/"+id+"/devices", nil, "Authorization", "Bearer "+adminToken, "Admin-Agent", "joana.support")
	revoked := r.JSON(t)
	if r.Status != http.StatusOK || revoked["unregistered_devices"] != 1.0 || revoked["account_id"] != id {
		t.Fatalf("revoking Carla's devices: %v, want 200 with one device unregistered", r)
	}
	at, err := time.Parse(time.RFC3339Nano, revoked["revoked_at"].(string))
	if err != nil {
		t.Fatal(err)
	}
	// The desk's replica at once; the other within its polling interval (500 ms): allow 10 s. The
	// poll reads the phone's limits, which spends the phone's own settings bucket: polling the
	// statement spent Carla's statement quota (30 a minute) on a loaded machine, whose replica took
	// longer to learn of the revocation, and the new phone's first statement below was refused.
	for _, c := range []*api{a, b} {
		var last apitest.Response
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if last = c.Do(http.MethodGet, "/v1/limits", nil, "Authorization", "Bearer "+phone); last.Status == http.StatusUnauthorized {
				break
			}
		}
		if last.Status != http.StatusUnauthorized {
			t.Fatalf("the stolen phone's access token after the revocation: %v, want 401", last)
		}
		if r := c.Statement(phone); r.Status != http.StatusUnauthorized {
			t.Fatalf("the stolen phone's statement after the revocation: %v, want 401", r)
		}
		if r := c.Login(carla.Document, carla.Password, "X-Forwarded-For", "203.0.113.62", "Device-Token", device); r.Status != http.StatusTooManyRequests {
			t.Errorf("a login with the revoked device token while the document key is full: %v, want 429", r)
		}
	}

	// Support clears the document key too; Carla logs in on a new phone at once: tokens carry
	// their issue time in milliseconds, from the ledger's clock, as the revocation does, so a
	// login answered after the revocation gets a token that works, in its own second too.
	if r := desk.Do(http.MethodDelete, "/admin/v1/keys/login-account/"+carla.Document, nil, "Authorization", "Bearer "+adminToken); r.Status != http.StatusOK {
		t.Fatalf("clearing the document key: %v", r)
	}
	fresh := a.Login(carla.Document, carla.Password, "X-Forwarded-For", "203.0.113.63")
	token := fresh.JSON(t)["access_token"].(string)
	if r := b.Statement(token); r.Status != http.StatusOK {
		t.Errorf("a token issued after the revocation (at %s): %v, want 200", at.Format(time.StampMilli), r)
	}
	if r := b.PIX(token, "padaria@example.com", 30_000); r.Status != http.StatusUnprocessableEntity || r.JSON(t)["error"] != "device_limit_exceeded" {
		t.Errorf("R$ 300,00 from the new phone: %v, want 422 device_limit_exceeded", r)
	}
	// The password alone registers no phone after a revocation: a phisher's would wait
	// DEVICE_REGISTRATION_DELAY, and so does Carla's, until the desk approves it.
	reg := a.Do(http.MethodPost, "/v1/devices/current/register", map[string]string{"password": carla.Password}, "Authorization", "Bearer "+token)
	if reg.Status != http.StatusAccepted || reg.JSON(t)["registered"] != false {
		t.Fatalf("registering a phone after the revocation: %v, want 202 pending", reg)
	}
	if r := b.PIX(token, "padaria@example.com", 150_000); r.Status != http.StatusUnprocessableEntity || r.JSON(t)["error"] != "device_limit_exceeded" {
		t.Errorf("R$ 1.500,00 from the pending phone: %v, want 422 device_limit_exceeded", r)
	}
	newPhone := reg.JSON(t)["device_id"].(string)
	if r := desk.Do(http.MethodPost, "/admin/v1/accounts/"+id+"/devices/NOPE/approve", nil, "Authorization", "Bearer "+adminToken); r.Status != http.StatusNotFound {
		t.Errorf("the desk approving a device that never asked: %v, want 404", r)
	}
	if r := desk.Do(http.MethodPost, "/admin/v1/accounts/"+id+"/devices/"+newPhone+"/approve", nil, "Authorization", "Bearer "+adminToken, "Admin-Agent", "joana.support"); r.Status != http.StatusOK || r.JSON(t)["registered"] != true {
		t.Fatalf("the desk approving Carla's new phone: %v, want 200 registered", r)
	}
	if r := b.PIX(token, "padaria@example.com", 150_000); r.Status != http.StatusCreated {
		t.Errorf("R$ 1.500,00 from the phone the desk approved: %v, want 201", r)
	}

	conn, err := pgx.Connect(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var status int
	var key, before, after string
	if err := conn.QueryRow(context.Background(), `SELECT status, key, before, after FROM admin_audit
		WHERE action = 'DELETE /admin/v1/accounts/:account_id/devices' AND outcome = 'done'`).Scan(&status, &key, &before, &after); err != nil {
		t.Fatalf("the revocation's audit record: %v", err)
	}
	if status != 200 || strings.Contains(key, id) || !strings.HasPrefix(key, "account:") ||
		before != `{"revoked_at":null}` || !strings.Contains(after, `"unregistered_devices":1`) {
		t.Errorf("the revocation's audit record: %d %s %s %s", status, key, before, after)
	}
	if err := conn.QueryRow(context.Background(), `SELECT status, key, after FROM admin_audit
		WHERE action = 'POST /admin/v1/accounts/:account_id/devices/:device_id/approve' AND outcome = 'done' AND status = 200`).Scan(&status, &key, &after); err != nil {
		t.Fatalf("the approval's audit record: %v", err)
	}
	if strings.Contains(key, id) || strings.Contains(after, newPhone) || !strings.Contains(after, `"registered":true`) {
		t.Errorf("the approval's audit record: %s %s", key, after)
	}
}

// TestADeskClientThatGoesAwayLeavesNoChangeUnrecorded: 50 times, a desk client sends a DELETE of
// a login-ip key holding one login and resets its connection (SO_LINGER 0) a few milliseconds
// later, as an insider hiding a change would; every other time, as soon as the change's
// "requested" record is stored (so some resets land mid-change on any machine). Whether or not the key was cleared, a cleared key
// has its change recorded before ("requested") and after ("done"), and every requested change
// has its outcome.
func TestADeskClientThatGoesAwayLeavesNoChangeUnrecorded(t *testing.T) {
	t.Parallel()
	srv, db := redistest.Start(t), pgtest.URL(t)
	adminToken := rand.Text() + rand.Text()
	env := map[string]string{"DATABASE_URL": db, "DEMO_ACCOUNTS": "true", "TRUSTED_PROXIES": "127.0.0.1/32",
		"ADMIN_ADDR": apitest.FreeAddr(t), "ADMIN_TOKEN": adminToken}
	a := startAPI(t, srv, env)
	desk := &apitest.Client{T: t, Base: "http://" + env["ADMIN_ADDR"]}
	const tries = 50
	ip := func(i int) string { return fmt.Sprintf("198.51.100.%d", i+1) }
	for i := range tries {
		if r := a.Login(apitest.CPF(100+i), "wrong", "X-Forwarded-For", ip(i)); r.Status != http.StatusUnauthorized {
			t.Fatalf("login from %s: %v", ip(i), r)
		}
	}
	pg := pgtest.Connect(t, db)
	requested := func() (n int) {
		if err := pg.QueryRow(t.Context(), "SELECT count(*) FROM admin_audit WHERE outcome = 'requested'").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for i := range tries {
		before := requested()
		conn, err := net.Dial("tcp", env["ADMIN_ADDR"])
		if err != nil {
			t.Fatal(err)
		}
		_ = conn.(*net.TCPConn).SetLinger(0) // Close sends a reset, not a FIN
		fmt.Fprintf(conn, "DELETE /admin/v1/keys/login-ip/%s HTTP/1.1\r\nHost: desk\r\nAuthorization: Bearer %s\r\n\r\n", ip(i), adminToken)
		if i%2 == 0 {
			time.Sleep(time.Duration(i%6) * time.Millisecond)
		} else {
			for deadline := time.Now().Add(5 * time.Second); requested() == before && time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			}
		}
		conn.Close()
	}

	outcomes := func() map[string][]string { // by Redis key: the outcomes of its DELETEs, in order
		rows, err := pg.Query(t.Context(), `SELECT key, outcome, request FROM admin_audit
			WHERE action = 'DELETE /admin/v1/keys/:policy/:identity' ORDER BY seq`)
		if err != nil {
			t.Fatal(err)
		}
		byKey, requested := map[string][]string{}, map[string]string{}
		for rows.Next() {
			var key, outcome, request string
			if err := rows.Scan(&key, &outcome, &request); err != nil {
				t.Fatal(err)
			}
			if outcome == "requested" {
				requested[request] = "pending"
				continue
			}
			delete(requested, request)
			byKey[key] = append(byKey[key], outcome)
		}
		if len(requested) > 0 {
			return nil // a change still under way
		}
		return byKey
	}
	var byKey map[string][]string
	for deadline := time.Now().Add(20 * time.Second); byKey == nil && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		byKey = outcomes()
	}
	if byKey == nil {
		t.Fatal("requested changes without an outcome 20 s after their clients went away")
	}
	cleared := 0
	for i := range tries {
		r := desk.Do(http.MethodGet, "/admin/v1/keys/login-ip/"+ip(i), nil, "Authorization", "Bearer "+adminToken)
		body := r.JSON(t)
		key, _ := body["key"].(string)
		if r.Status != http.StatusOK || key == "" {
			t.Fatalf("reading %s's key: %v", ip(i), r)
		}
		if body["remaining"] == body["limit"] { // cleared
			cleared++
			// A DELETE the server read late (a loaded machine) may have made its change since the
			// records were read: its records are written on either side of it, so wait for them.
			for deadline := time.Now().Add(10 * time.Second); len(byKey[key]) == 0 && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
				if now := outcomes(); now != nil {
					byKey = now
				}
			}
			if got := byKey[key]; len(got) != 1 || got[0] != "done" {
				t.Errorf("%s's key was cleared, and its DELETE's records say %v, want requested then done", ip(i), got)
			}
		}
	}
	t.Logf("%d of %d keys cleared by a client that went away", cleared, tries)
	if cleared == 0 {
		t.Error("no DELETE reached the desk before its client reset the connection: nothing was tested")
	}
}

// TestTheDeskLimitsCallsWithoutTheToken: calls without the right token count against the caller's
// IP (admin-ip, 10 a minute): the 11th is 429 with Retry-After, and the right token still works.
// The desk decides through the replica's stack, as the routes do: with Redis gone, the next guess
// is still refused rate_limit_exceeded, from the deny cache's memory of the full key.
func TestTheDeskLimitsCallsWithoutTheToken(t *testing.T) {
	t.Parallel()
	adminToken := rand.Text() + rand.Text()
	env := map[string]string{"ADMIN_ADDR": apitest.FreeAddr(t), "ADMIN_TOKEN": adminToken}
	srv := redistest.Start(t)
	startAPI(t, srv, env)
	desk := &apitest.Client{T: t, Base: "http://" + env["ADMIN_ADDR"]}
	for i := range 11 {
		r := desk.Do(http.MethodGet, "/admin/v1/tiers", nil, "Authorization", "Bearer guess-"+fmt.Sprint(i))
		want := map[bool]int{true: http.StatusTooManyRequests, false: http.StatusUnauthorized}[i == 10]
		if r.Status != want || i == 10 && r.Header.Get("Retry-After") == "" {
			t.Fatalf("guess %d: %v, want %d", i+1, r, want)
		}
	}
	if r := desk.Do(http.MethodGet, "/admin/v1/tiers", nil, "Authorization", "Bearer "+adminToken); r.Status != http.StatusOK {
		t.Errorf("the right token from the same IP: %v, want 200", r)
	}
	srv.Kill()
	r := desk.Do(http.MethodGet, "/admin/v1/tiers", nil, "Authorization", "Bearer guess-12")
	if got := r.JSON(t)["error"]; r.Status != http.StatusTooManyRequests || got != "rate_limit_exceeded" {
		t.Errorf("a 12th guess with Redis gone: %v (%v), want 429 rate_limit_exceeded from the deny cache", r, got)
	}
}

// TestAStoppedReplicaWritesItsDeskRefusals: calls to the desk without the right token are audited
// as a summary when their minute ends; a replica stopped (as SIGTERM stops it) within the minute
// writes its summary as it stops, not never.
func TestAStoppedReplicaWritesItsDeskRefusals(t *testing.T) {
	t.Parallel()
	srv, db := redistest.Start(t), pgtest.URL(t)
	env := map[string]string{"DATABASE_URL": db, "ADMIN_ADDR": apitest.FreeAddr(t), "ADMIN_TOKEN": rand.Text() + rand.Text()}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	_, done := launch(t, ctx, srv, env)
	desk := &apitest.Client{T: t, Base: "http://" + env["ADMIN_ADDR"]}
	for range 3 {
		if r := desk.Do(http.MethodGet, "/admin/v1/tiers", nil, "Authorization", "Bearer not-the-token"); r.Status != http.StatusUnauthorized {
			t.Fatalf("a call with a wrong token: %v, want 401", r)
		}
	}
	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("api exit: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("api did not stop within 15s")
	}
	var calls int
	if err := pgtest.Connect(t, db).QueryRow(t.Context(), "SELECT coalesce(sum(calls), 0) FROM admin_audit WHERE outcome = 'refused'").Scan(&calls); err != nil {
		t.Fatal(err)
	}
	if calls != 3 {
		t.Errorf("refused calls audited after the stop: %d, want 3", calls)
	}
}

// TestTheDeskRefusesWhatItCannotName: on PostgreSQL, a tier name no tier can have (a NUL in it)
// is 400, not a 500 from the database, and changes nothing; an Admin-Agent outside its pattern, or
// sent twice, is 400 and audited as a failed call, not silently dropped; a CNPJ's slash
// percent-encoded in a key's identity (the one segment the contract's path has) is decoded. (The
// last two are sent raw: the test client sets one header of a name, and its contract check
// matches routes on the decoded path.)
func TestTheDeskRefusesWhatItCannotName(t *testing.T) {
	t.Parallel()
	db, token := pgtest.URL(t), rand.Text()+rand.Text()
	env := map[string]string{"DATABASE_URL": db, "DEMO_ACCOUNTS": "true", "ADMIN_ADDR": apitest.FreeAddr(t), "ADMIN_TOKEN": token}
	startAPI(t, redistest.Start(t), env)
	desk := &apitest.Client{T: t, Base: "http://" + env["ADMIN_ADDR"]}
	for _, tier := range []string{"prem\u0000ium", "\u0000", "premium\u0000"} {
		if r := desk.Do(http.MethodPut, "/admin/v1/accounts/acct-diego/tier", map[string]string{"tier": tier}, "Authorization", "Bearer "+token); r.Status != http.StatusBadRequest {
			t.Errorf("the tier %q: %v, want 400", tier, r)
		}
	}
	raw := func(path string, agents ...string) int {
		req, err := http.NewRequest(http.MethodGet, desk.Base+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+token)
		for _, a := range agents {
			req.Header.Add("Admin-Agent", a)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, agents := range [][]string{{"bad agent!"}, {strings.Repeat("a", 65)}, {"ana", "bruno"}} {
		if got := raw("/admin/v1/tiers", agents...); got != http.StatusBadRequest {
			t.Errorf("Admin-Agent %q: %d, want 400", agents, got)
		}
	}
	var failed int
	if err := pgtest.Connect(t, db).QueryRow(t.Context(), "SELECT count(*) FROM admin_audit WHERE status = 400 AND action = 'GET /admin/v1/tiers'").Scan(&failed); err != nil || failed != 3 {
		t.Errorf("refused agents audited: %d (%v), want 3", failed, err)
	}
	if got := raw("/admin/v1/keys/login-account/11.222.333%2F0001-81", "ana"); got != http.StatusOK {
		t.Errorf("a CNPJ's key, its slash encoded: %d, want 200", got)
	}
}
