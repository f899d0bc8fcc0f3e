package main

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pixlimit/pixlimit/internal/auth"
	"github.com/pixlimit/pixlimit/internal/pix"
	"github.com/pixlimit/pixlimit/internal/testing/apitest"
	"github.com/pixlimit/pixlimit/internal/testing/redistest"
)

func TestLoginIssuesATokenTheAPIAccepts(t *testing.T) {
	t.Parallel()
	a := startAPI(t, redistest.Start(t), nil)
	r := a.Login("529.982.247-25", "demo-ana-123")
	if r.Status != http.StatusOK {
		t.Fatalf("login: %v", r)
	}
	body := r.JSON(t)
	if body["token_type"] != "Bearer" || body["expires_in"] != 900.0 || body["account_id"] == "" || body["access_token"] == "" {
		t.Errorf("login body = %v, want token_type Bearer, expires_in 900, an account_id and a token", body)
	}
	if got, want := r.Header.Get("RateLimit-Policy"), `"login-ip";q=10;w=600`; got != want {
		t.Errorf("RateLimit-Policy = %q, want %q: an admitted login reports its IP key only", got, want)
	}
	if got := a.Login("52998224725", "demo-ana-123").JSON(t)["account_id"]; got != body["account_id"] {
		t.Errorf("the document without punctuation logs into %v, want %v", got, body["account_id"])
	}
	st := a.Statement(body["access_token"].(string))
	if st.Status != http.StatusOK || st.JSON(t)["account_id"] != body["account_id"] {
		t.Fatalf("statement with the token: %v", st)
	}
}

// TestWrongPasswordAndUnknownDocumentLookTheSame, at a real deployment's bcrypt cost: the same
// status, body and headers, and both slow enough to have run bcrypt (a lower bound: a slower
// machine only makes them slower). auth's TestTheDummyHashCostsWhatTheAccountsDo checks the
// dummy hash's cost at any cost.
func TestWrongPasswordAndUnknownDocumentLookTheSame(t *testing.T) {
	t.Parallel()
	a := startAPIAt(t, redistest.Start(t), map[string]string{"TRUSTED_PROXIES": "127.0.0.1/32"}, auth.DefaultPasswordCost)
	unknown := apitest.CPF(42) // valid CPF, no account
	wrong := a.Login("529.982.247-25", "not-the-password", "X-Forwarded-For", "198.51.100.1")
	missing := a.Login(unknown, "not-the-password", "X-Forwarded-For", "198.51.100.2")

	if wrong.Status != http.StatusUnauthorized || missing.Status != http.StatusUnauthorized {
		t.Fatalf("wrong password: %v; unknown document: %v; want 401 both", wrong, missing)
	}
	if !bytes.Equal(wrong.Body, missing.Body) {
		t.Errorf("bodies differ:\n wrong password:   %s\n unknown document: %s", wrong.Body, missing.Body)
	}
	if got := wrong.JSON(t)["error"]; got != "invalid_credentials" {
		t.Errorf("error = %v, want invalid_credentials", got)
	}
	stable := func(h http.Header) http.Header {
		h = h.Clone()
		for k := range h {
			if strings.HasPrefix(k, "Ratelimit") || k == "Date" {
				delete(h, k)
			}
		}
		return h
	}
	if w, m := stable(wrong.Header), stable(missing.Header); !maps.EqualFunc(w, m, slices.Equal) {
		t.Errorf("headers differ (RateLimit and Date aside):\n wrong password:   %v\n unknown document: %v", w, m)
	}
	// Both paths run bcrypt: an unknown document is compared against a dummy hash.
	for name, r := range map[string]apitest.Response{"wrong password": wrong, "unknown document": missing} {
		if r.Took < 20*time.Millisecond {
			t.Errorf("%s answered in %v: too fast for a bcrypt comparison", name, r.Took)
		}
	}
}

// TestLoginRefusalsByEitherKeyHaveOneShape: a login refused by the document key (a botnet) and
// one refused by the IP key (a sweep) have the same status, the same body (but the seconds left)
// and the same header names and RateLimit-Policy, as the contract says. The RateLimit values
// differ, and say so: each names the key that refused (the worst), as the IETF draft has it.
func TestLoginRefusalsByEitherKeyHaveOneShape(t *testing.T) {
	t.Parallel()
	a := startAPI(t, redistest.Start(t), map[string]string{"TRUSTED_PROXIES": "127.0.0.1/32"})

	// A botnet: 6 IPs, one guess each at Carla's document. The document key allows 5.
	var byDocument apitest.Response
	for i := range 6 {
		byDocument = a.Login("111.444.777-35", "guess", "X-Forwarded-For", fmt.Sprintf("203.0.113.%d", i+1))
		if want := map[bool]int{true: 429, false: 401}[i == 5]; byDocument.Status != want {
			t.Fatalf("guess %d from its own IP: %v, want %d", i+1, byDocument, want)
		}
	}
	// One IP, 11 different documents. The IP key allows 10.
	var byIP apitest.Response
	for i := range 11 {
		byIP = a.Login(apitest.CPF(i), "guess", "X-Forwarded-For", "198.51.100.77")
		if want := map[bool]int{true: 429, false: 401}[i == 10]; byIP.Status != want {
			t.Fatalf("document %d from one IP: %v, want %d", i+1, byIP, want)
		}
	}

	for name, r := range map[string]apitest.Response{"document key": byDocument, "IP key": byIP} {
		body := r.JSON(t)
		if body["error"] != "rate_limit_exceeded" || r.Header.Get("Retry-After") == "" ||
			r.Header.Get("Retry-After") != r.Header.Get("RateLimit-Reset") {
			t.Errorf("refused by the %s: %v %v", name, r, r.Header)
		}
		if got, want := r.Header.Get("RateLimit-Policy"), `"login-ip";q=10;w=600, "login-account";q=5;w=600`; got != want {
			t.Errorf("refused by the %s: RateLimit-Policy = %q, want %q", name, got, want)
		}
	}
	strip := func(r apitest.Response) map[string]any {
		m := r.JSON(t)
		delete(m, "retry_after_seconds") // seconds left differ with timing, not with the key
		return m
	}
	if d, i := strip(byDocument), strip(byIP); !maps.Equal(d, i) {
		t.Errorf("the two refusals differ:\n document key: %v\n IP key:       %v", d, i)
	}
	if !slices.Equal(slices.Sorted(maps.Keys(byDocument.Header)), slices.Sorted(maps.Keys(byIP.Header))) {
		t.Errorf("the two refusals carry different headers: %v vs %v", byDocument.Header, byIP.Header)
	}
	for r, key := range map[*apitest.Response]string{&byDocument: `"login-account"`, &byIP: `"login-ip"`} {
		if got := r.Header.Get("RateLimit"); !strings.HasPrefix(got, key+";r=0") {
			t.Errorf("RateLimit %q, want the refusing key %s with none left", got, key)
		}
	}
}

// TestALoginDoesNotRevealSomeoneElsesActivity: three guesses at Ana's document from other IPs,
// then a stranger logs in with Ana's CPF from a fresh IP, and with a CPF no account has. Neither
// answer says how many attempts the document has had: both report the stranger's own IP key.
func TestALoginDoesNotRevealSomeoneElsesActivity(t *testing.T) {
	t.Parallel()
	a := startAPI(t, redistest.Start(t), map[string]string{"TRUSTED_PROXIES": "127.0.0.1/32"})
	for i := range 3 {
		a.Login(demo[0].Document, "guess", "X-Forwarded-For", fmt.Sprintf("192.0.2.%d", i+1))
		a.Login(apitest.CPF(7), "guess", "X-Forwarded-For", fmt.Sprintf("192.0.2.%d", i+1))
	}
	for name, r := range map[string]apitest.Response{
		"Ana's CPF":    a.Login(demo[0].Document, "guess", "X-Forwarded-For", "198.51.100.50"),
		"unknown CPF":  a.Login(apitest.CPF(7), "guess", "X-Forwarded-For", "198.51.100.51"),
		"Ana herself":  a.Login(demo[0].Document, demo[0].Password, "X-Forwarded-For", "198.51.100.52"),
		"invalid body": a.Login("not a CPF", "x", "X-Forwarded-For", "198.51.100.53"),
	} {
		if got, want := r.Header.Get("RateLimit"), `"login-ip";r=9;t=600`; got != want {
			t.Errorf("%s from a fresh IP: RateLimit %q, want %q (its own IP key only)", name, got, want)
		}
		if got, want := r.Header.Get("RateLimit-Policy"), `"login-ip";q=10;w=600`; got != want {
			t.Errorf("%s: RateLimit-Policy %q, want %q", name, got, want)
		}
	}
}

func TestRefusalByTheDocumentKeyConsumesNoIPQuota(t *testing.T) {
	t.Parallel()
	a := startAPI(t, redistest.Start(t), map[string]string{"TRUSTED_PROXIES": "127.0.0.1/32"})
	for i := range 5 { // fill Diego's document key from five other IPs
		a.Login("935.411.347-80", "guess", "X-Forwarded-For", fmt.Sprintf("192.0.2.%d", i+1))
	}
	const ip = "198.51.100.9"
	for i := range 20 { // insisting on the full document from one IP
		if r := a.Login("935.411.347-80", "guess", "X-Forwarded-For", ip); r.Status != http.StatusTooManyRequests {
			t.Fatalf("attempt %d on the full document: %v, want 429", i+1, r)
		}
	}
	// The IP still has all 10 of its attempts.
	for i := range 10 {
		r := a.Login(apitest.CPF(100+i), "guess", "X-Forwarded-For", ip)
		if r.Status != http.StatusUnauthorized {
			t.Fatalf("attempt %d of the IP's quota after 20 refusals: %v, want 401", i+1, r)
		}
	}
}

func TestForwardedForIsHonouredOnlyFromTrustedProxies(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	direct := startAPI(t, srv, map[string]string{"LOGIN_IP_LIMIT": "3"})
	behindProxy := startAPI(t, srv, map[string]string{"LOGIN_IP_LIMIT": "3", "TRUSTED_PROXIES": "127.0.0.0/8, ::1/128"})

	// No trusted proxy: a client rotating X-Forwarded-For is still one client.
	for i := range 4 {
		r := direct.Do(http.MethodPost, "/v1/login", `{"document":"x","password":"y"}`, "X-Forwarded-For", fmt.Sprintf("203.0.113.%d", i))
		if want := map[bool]int{true: 429, false: 400}[i == 3]; r.Status != want {
			t.Fatalf("spoofed X-Forwarded-For, request %d: %v, want %d", i+1, r, want)
		}
	}
	// Behind a trusted proxy each forwarded client has its own quota, keyed by the right-most
	// untrusted hop: what the client wrote to the left of it does not matter.
	for i := range 4 {
		xff := fmt.Sprintf("10.9.9.%d, 203.0.113.50", i)
		if r := behindProxy.Do(http.MethodPost, "/v1/login", `{"document":"x","password":"y"}`, "X-Forwarded-For", xff); r.Status != map[bool]int{true: 429, false: 400}[i == 3] {
			t.Fatalf("client 203.0.113.50 with forged hops, request %d: %v", i+1, r)
		}
	}
	if r := behindProxy.Do(http.MethodPost, "/v1/login", `{"document":"x","password":"y"}`, "X-Forwarded-For", "203.0.113.51"); r.Status != http.StatusBadRequest {
		t.Fatalf("another forwarded client: %v, want 400 (not limited)", r)
	}
	// Both IPv6 addresses of one /64 are one client.
	for i := range 4 {
		xff := fmt.Sprintf("2001:db8:aa:bb::%x", i+1)
		if r := behindProxy.Do(http.MethodPost, "/v1/login", `{"document":"x","password":"y"}`, "X-Forwarded-For", xff); r.Status != map[bool]int{true: 429, false: 400}[i == 3] {
			t.Fatalf("IPv6 %s, request %d of one /64: %v", xff, i+1, r)
		}
	}
}

// TestATrustedDeviceIsNotLockedOut: Carla logs in on her phone and keeps its device token; a
// botnet then fills her document key. From a new device she is refused; with the token, by
// header or by cookie, she gets in. A forged token, one for another account, one from another
// secret, or garbage counts as none. And a device that guesses is refused by its own key, with
// the same answer as the document key's.
func TestATrustedDeviceIsNotLockedOut(t *testing.T) {
	t.Parallel()
	a := startAPI(t, redistest.Start(t), map[string]string{"TRUSTED_PROXIES": "127.0.0.1/32"})
	carla, ana := demo[2], demo[0]
	first := a.Login(carla.Document, carla.Password, "X-Forwarded-For", "198.51.100.1")
	phone, _ := first.JSON(t)["device_token"].(string)
	if first.Status != http.StatusOK || phone == "" {
		t.Fatalf("Carla's first login: %v, want 200 with a device_token", first)
	}
	cookie := first.Header.Get("Set-Cookie")
	for _, attr := range []string{"__Host-pixlimit-device=" + phone, "Path=/", "Secure", "HttpOnly", "SameSite=Strict", "Max-Age=2592000"} {
		if !strings.Contains(cookie, attr) {
			t.Errorf("Set-Cookie %q lacks %q", cookie, attr)
		}
	}
	anasDevice, _ := a.Login(ana.Document, ana.Password, "X-Forwarded-For", "198.51.100.2").JSON(t)["device_token"].(string)

	for i := range 4 { // the botnet: her own login used one of the document's five attempts
		if r := a.Login(carla.Document, "guess", "X-Forwarded-For", fmt.Sprintf("203.0.113.%d", i+1)); r.Status != http.StatusUnauthorized {
			t.Fatalf("guess %d: %v, want 401", i+1, r)
		}
	}
	lockedOut := a.Login(carla.Document, carla.Password, "X-Forwarded-For", "192.0.2.10")
	if lockedOut.Status != http.StatusTooManyRequests {
		t.Fatalf("Carla from a new device: %v, want 429: the document key is full", lockedOut)
	}
	forged := phone[:len(phone)-4] + "AAAA"
	for name, token := range map[string]string{"forged": forged, "Ana's device": anasDevice, "garbage": "not-a-token",
		"another secret": otherSecretDevice(t, carla.Document)} {
		if r := a.Login(carla.Document, carla.Password, "X-Forwarded-For", "192.0.2.11", "Device-Token", token); r.Status != http.StatusTooManyRequests {
			t.Errorf("%s token: %v, want 429 (counted as no token)", name, r)
		}
	}
	r := a.Login(carla.Document, carla.Password, "X-Forwarded-For", "192.0.2.12", "Device-Token", phone)
	if r.Status != http.StatusOK {
		t.Fatalf("Carla's phone, by header: %v, want 200", r)
	}
	if got := r.Header.Get("RateLimit-Policy"); got != `"login-ip";q=10;w=600` {
		t.Errorf("RateLimit-Policy %q: an admitted login reports its IP key only", got)
	}
	if r := a.Login(carla.Document, carla.Password, "X-Forwarded-For", "192.0.2.13", "Cookie", "__Host-pixlimit-device="+phone); r.Status != http.StatusOK {
		t.Fatalf("Carla's phone, by cookie: %v, want 200", r)
	}

	// A stolen phone guesses: three more attempts fill the device's own key (5), then it is refused.
	for i := range 3 {
		if r := a.Login(carla.Document, "guess", "X-Forwarded-For", fmt.Sprintf("192.0.2.%d", 20+i), "Device-Token", phone); r.Status != http.StatusUnauthorized {
			t.Fatalf("device guess %d: %v, want 401", i+1, r)
		}
	}
	byDevice := a.Login(carla.Document, "guess", "X-Forwarded-For", "192.0.2.30", "Device-Token", phone)
	if byDevice.Status != http.StatusTooManyRequests {
		t.Fatalf("the device's 6th login: %v, want 429 from its own key", byDevice)
	}
	// The device's key is reported under the document key's policy: a refusal never says whether
	// a device token is valid (TestARefusalDoesNotSayWhoseDeviceItIs).
	if got := byDevice.Header.Get("RateLimit-Policy"); got != `"login-ip";q=10;w=600, "login-account";q=5;w=600` {
		t.Errorf("refused by the device key: RateLimit-Policy %q", got)
	}
	strip := func(r apitest.Response) map[string]any {
		m := r.JSON(t)
		delete(m, "retry_after_seconds")
		return m
	}
	if d, k := strip(byDevice), strip(lockedOut); !maps.Equal(d, k) ||
		!slices.Equal(slices.Sorted(maps.Keys(byDevice.Header)), slices.Sorted(maps.Keys(lockedOut.Header))) {
		t.Errorf("refused by the device key and by the document key differ:\n %v %v\n %v %v", byDevice, byDevice.Header, lockedOut, lockedOut.Header)
	}
}

// TestARemovedDeviceIsNoTrustedDevice: a device its owner removed (a stolen phone) is trusted
// no more at the login either: its device token counts as none, so the thief, password or not,
// meets the document key as any new device does, and a login does not give the removed device
// id new tokens.
func TestARemovedDeviceIsNoTrustedDevice(t *testing.T) {
	t.Parallel()
	a := startAPI(t, redistest.Start(t), map[string]string{"TRUSTED_PROXIES": "127.0.0.1/32"})
	carla := demo[2]
	first := a.Login(carla.Document, carla.Password, "X-Forwarded-For", "198.51.100.1").JSON(t)
	access, phone := first["access_token"].(string), first["device_token"].(string)
	reg := a.Do(http.MethodPost, "/v1/devices/current/register", map[string]string{"password": carla.Password}, "Authorization", "Bearer "+access)
	device, _ := reg.JSON(t)["device_id"].(string)
	if reg.Status != http.StatusOK || device == "" {
		t.Fatalf("registering the phone: %v", reg)
	}
	if r := a.Do(http.MethodDelete, "/v1/devices/"+device, nil, "Authorization", "Bearer "+access); r.Status != http.StatusNoContent {
		t.Fatalf("removing the phone: %v, want 204", r)
	}
	for i := range 4 { // her first login used one of the document's five attempts
		if r := a.Login(carla.Document, "guess", "X-Forwarded-For", fmt.Sprintf("203.0.113.%d", i+1)); r.Status != http.StatusUnauthorized {
			t.Fatalf("guess %d: %v, want 401", i+1, r)
		}
	}
	if r := a.Login(carla.Document, carla.Password, "X-Forwarded-For", "192.0.2.11", "Device-Token", phone); r.Status != http.StatusTooManyRequests {
		t.Errorf("the removed phone's device token, the document key full: %v, want 429 (counted as no device)", r)
	}
}

// TestARefusalDoesNotSayWhoseDeviceItIs: with the IP key full, a login refusal costs nothing, so
// its answer must not depend on whether the device token it presents is valid for its CPF, or a
// stolen token would find its owner's CPF by trying CPFs. Carla's own token, a forged one and
// none get the same status, error, header names, RateLimit-Policy and RateLimit-Limit.
func TestARefusalDoesNotSayWhoseDeviceItIs(t *testing.T) {
	t.Parallel()
	a := startAPI(t, redistest.Start(t), map[string]string{"TRUSTED_PROXIES": "127.0.0.1/32"})
	carla := demo[2]
	phone, _ := a.Login(carla.Document, carla.Password, "X-Forwarded-For", "198.51.100.7").JSON(t)["device_token"].(string)
	for i := range 9 { // the IP key's other nine
		if r := a.Login(apitest.CPF(i), "guess", "X-Forwarded-For", "198.51.100.7"); r.Status != http.StatusUnauthorized {
			t.Fatalf("login %d: %v, want 401", i+2, r)
		}
	}
	answers := map[string]apitest.Response{}
	for name, token := range map[string]string{"her phone": phone, "forged": phone[:len(phone)-4] + "AAAA", "none": ""} {
		r := a.Login(carla.Document, carla.Password, "X-Forwarded-For", "198.51.100.7", "Device-Token", token)
		if r.Status != http.StatusTooManyRequests {
			t.Fatalf("%s: %v, want 429: the IP key is full", name, r)
		}
		answers[name] = r
	}
	want := answers["none"]
	for name, r := range answers {
		if got := r.Header.Get("RateLimit-Policy"); got != want.Header.Get("RateLimit-Policy") || got != `"login-ip";q=10;w=600, "login-account";q=5;w=600` {
			t.Errorf("%s: RateLimit-Policy %q, want %q for every token", name, got, want.Header.Get("RateLimit-Policy"))
		}
		if !slices.Equal(slices.Sorted(maps.Keys(r.Header)), slices.Sorted(maps.Keys(want.Header))) || r.JSON(t)["error"] != want.JSON(t)["error"] ||
			r.Header.Get("RateLimit-Limit") != want.Header.Get("RateLimit-Limit") {
			t.Errorf("%s: %v %v, want the answer to no token: %v %v", name, r, r.Header, want, want.Header)
		}
	}
}

// otherSecretDevice is a device token for document signed by a fleet with another AUTH_SECRET.
func otherSecretDevice(t *testing.T, document string) string {
	t.Helper()
	doc, _ := pix.ParseCPF(document)
	other, err := auth.NewDevices([]byte(rand.Text()+rand.Text()), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := other.Issue(doc, "", time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestOneIPv6SiteCannotMintLoginKeys: logins from many /64s of one /48 count against the /48 too
// (login-net; here 5 per window): the sixth /64 of the site is refused with any login 429's
// shape, having cost Redis nothing more, while another site and an IPv4 client are not.
func TestOneIPv6SiteCannotMintLoginKeys(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	a := startAPI(t, srv, map[string]string{"TRUSTED_PROXIES": "127.0.0.1/32", "LOGIN_NET_LIMIT": "5"})
	for i := range 6 {
		r := a.Login(apitest.CPF(300+i), "guess", "X-Forwarded-For", fmt.Sprintf("2001:db8:7:%x::1", i+1))
		want := map[bool]int{true: http.StatusTooManyRequests, false: http.StatusUnauthorized}[i == 5]
		if r.Status != want {
			t.Fatalf("a login from the site's /64 number %d: %v, want %d", i+1, r, want)
		}
		if i == 5 && (r.JSON(t)["error"] != "rate_limit_exceeded" || r.Header.Get("Retry-After") == "" ||
			!strings.Contains(r.Header.Get("RateLimit-Policy"), `"login-net";q=5;w=600`)) {
			t.Errorf("refused by the site's key: %v %v, want a login 429 declaring login-net", r, r.Header)
		}
	}
	keys := srv.Client(nil).Keys(t.Context(), "rl:login-*").Val()
	if r := a.Login(apitest.CPF(320), "guess", "X-Forwarded-For", "2001:db8:8:1::1"); r.Status != http.StatusUnauthorized {
		t.Errorf("a login from another site: %v, want 401", r)
	}
	if r := a.Login(apitest.CPF(321), "guess", "X-Forwarded-For", "198.51.100.9"); r.Status != http.StatusUnauthorized ||
		strings.Contains(r.Header.Get("RateLimit-Policy"), "login-net") {
		t.Errorf("an IPv4 login: %v %v, want 401 without a site's key", r, r.Header)
	}
	// Five admitted logins: five /64 keys, the site's and five documents'; the refusal added none.
	if len(keys) != 11 {
		t.Errorf("%d login keys in Redis after 5 admitted and 1 refused logins, want 11: %v", len(keys), keys)
	}
}

// TestASiteFloodDoesNotLockOutItsTrustedDevices: an attacker fills a /48's login-net key from its
// /64s; Carla, on that site, with the device token of an earlier login, still logs in (neither
// counted nor refused by login-net, as by login-account), while a login without one is refused.
// A refusal of her trusted login (its own /64's key full) lists login-net in RateLimit-Policy
// as any refused login from the site does: the headers never tell a valid token apart.
func TestASiteFloodDoesNotLockOutItsTrustedDevices(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	a := startAPI(t, srv, map[string]string{"TRUSTED_PROXIES": "127.0.0.1/32", "LOGIN_NET_LIMIT": "5", "LOGIN_IP_LIMIT": "3"})
	carla := demo[2]
	first := a.Login(carla.Document, carla.Password, "X-Forwarded-For", "198.51.100.30")
	device := first.JSON(t)["device_token"].(string)
	for i := range 6 { // the flood: the sixth is refused by the site's key
		a.Login(apitest.CPF(400+i), "guess", "X-Forwarded-For", fmt.Sprintf("2001:db8:9:%x::1", i+1))
	}
	if r := a.Login(carla.Document, carla.Password, "X-Forwarded-For", "2001:db8:9:ff::1"); r.Status != http.StatusTooManyRequests {
		t.Fatalf("a login without a device token from the flooded site: %v, want 429", r)
	}
	if r := a.Login(carla.Document, carla.Password, "X-Forwarded-For", "2001:db8:9:fe::1", "Device-Token", device); r.Status != http.StatusOK {
		t.Fatalf("Carla's trusted device on the flooded site: %v, want 200", r)
	}
	var trusted, untrusted apitest.Response
	for range 4 { // her /64's own key (3) fills: the fourth is a refusal of a trusted login
		trusted = a.Login(carla.Document, "wrong", "X-Forwarded-For", "2001:db8:9:fd::1", "Device-Token", device)
	}
	for range 4 {
		untrusted = a.Login(carla.Document, "wrong", "X-Forwarded-For", "2001:db8:9:fc::1", "Device-Token", "forged")
	}
	tp, up := trusted.Header.Get("RateLimit-Policy"), untrusted.Header.Get("RateLimit-Policy")
	if trusted.Status != http.StatusTooManyRequests || !strings.Contains(tp, `"login-net";q=5;w=600`) || tp != up {
		t.Errorf("a refused trusted login's RateLimit-Policy %q (%v), want login-net listed, as a refused untrusted one's %q", tp, trusted, up)
	}
}
