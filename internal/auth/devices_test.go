package auth

import (
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/labstack/echo/v4"
)

func TestDevices(t *testing.T) {
	devices, err := NewDevices(secret, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	devices.now = func() time.Time { return now }
	const carla, ana = "11144477735", "52998224725"
	tok, err := devices.Issue(carla, "", time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	device, err := devices.Verify(tok, carla, never)
	if err != nil || device == "" {
		t.Fatalf("Verify(issued) = %q, %v", device, err)
	}
	if strings.Contains(tok, carla) {
		t.Error("the token carries the CPF in clear")
	}
	again, _ := devices.Issue(carla, device, time.Time{})
	if d, err := devices.Verify(again, carla, never); err != nil || d != device {
		t.Errorf("a re-issued token names device %q, %v; want the same %q", d, err, device)
	}
	other, _ := NewDevices([]byte("another-secret-another-secret-xx"), time.Hour)
	fromOther, _ := other.Issue(carla, "", time.Time{})
	tokens, _ := NewTokens(secret, time.Hour)
	access, _ := tokens.Issue(Subject{Account: "acct-carla", Payer: "payer-carla", Person: "PF"})
	unsigned, _ := jwt.NewWithClaims(jwt.SigningMethodNone, deviceClaims{RegisteredClaims: jwt.RegisteredClaims{ID: device,
		ExpiresAt: jwt.NewNumericDate(now.Add(time.Hour))}, Document: devices.bind(carla)}).SignedString(jwt.UnsafeAllowNoneSignatureType)
	for name, tt := range map[string]struct{ token, document string }{
		"another document":      {tok, ana},
		"another secret":        {fromOther, carla},
		"an access token":       {access, carla},
		"alg none":              {unsigned, carla},
		"tampered":              {tok[:len(tok)-2] + "xx", carla},
		"spelt otherwise":       {nonCanonical(t, tok), carla},
		"empty":                 {"", carla},
		"garbage":               {"not.a.token", carla},
		"oversized":             {strings.Repeat("a", 2000), carla},
		"another secret's doc":  {fromOther, ana},
		"a document that is no": {tok, ""},
	} {
		if d, err := devices.Verify(tt.token, tt.document, never); !errors.Is(err, ErrNoDevice) {
			t.Errorf("%s: Verify = %q, %v; want ErrNoDevice", name, d, err)
		}
	}
	now = now.Add(time.Hour + time.Second)
	if _, err := devices.Verify(tok, carla, never); !errors.Is(err, ErrNoDevice) {
		t.Errorf("after the TTL: %v, want ErrNoDevice", err)
	}
}

// FuzzDeviceToken: whatever a client sends as a device token, Verify answers without panicking,
// and trusts nothing but the device it issued, for its document.
func FuzzDeviceToken(f *testing.F) {
	devices, err := NewDevices(secret, time.Hour)
	if err != nil {
		f.Fatal(err)
	}
	const want = "the-one-device" // fixed: the fuzzing workers each run this function
	good, _ := devices.Issue("11144477735", want, time.Time{})
	for _, s := range []string{good, "", "a.b.c", good + "x", strings.ToUpper(good), "eyJhbGciOiJub25lIn0.e30."} {
		f.Add(s, "11144477735")
	}
	f.Fuzz(func(t *testing.T, token, document string) {
		device, err := devices.Verify(token, document, never)
		// (Base64 accepts a few spellings of the same signature: what matters is what is trusted.)
		if err == nil && (document != "11144477735" || device != want) {
			t.Fatalf("Verify(%q, %q) trusted device %q", token, document, device)
		}
	})
}

// TestRevocations: a revocation refuses the device and access tokens issued before it or in its
// own microsecond, and honours those issued after it, later in its own millisecond included (a
// login answered 200 just after a support desk's revocation gets tokens that work).
func TestRevocations(t *testing.T) {
	devices, _ := NewDevices(secret, time.Hour)
	tokens, _ := NewTokens(secret, time.Hour)
	const carla = "11144477735"
	revokedAt := time.Date(2026, 11, 30, 12, 0, 0, 700_000_000, time.UTC)
	for _, tt := range []struct {
		name   string
		issued time.Time
		ok     bool
	}{
		{"a second before", revokedAt.Add(-time.Second), false},
		{"earlier in its second", revokedAt.Add(-500 * time.Millisecond), false},
		{"a millisecond before", revokedAt.Add(-time.Millisecond), false},
		{"a microsecond before", revokedAt.Add(-time.Microsecond), false},
		{"in its microsecond", revokedAt.Add(400 * time.Nanosecond), false},
		{"a microsecond after", revokedAt.Add(time.Microsecond), true},
		{"later in its millisecond", revokedAt.Add(400 * time.Microsecond), true},
		{"a millisecond after", revokedAt.Add(time.Millisecond), true},
		{"later in its second", revokedAt.Add(200 * time.Millisecond), true},
		{"the next second", revokedAt.Add(300 * time.Millisecond), true},
	} {
		dt, _ := devices.Issue(carla, "phone", tt.issued) // stamped by the ledger's clock, as the login does
		at, _ := tokens.Issue(Subject{Account: "acct-carla", Payer: "payer-carla", Person: "PF", IssuedAt: tt.issued})
		devices.now = func() time.Time { return revokedAt.Add(time.Minute) }
		tokens.now = devices.now
		if _, err := devices.Verify(dt, carla, func(string) time.Time { return revokedAt }); (err == nil) != tt.ok {
			t.Errorf("device token issued %s the revocation: err %v, want honoured %v", tt.name, err, tt.ok)
		}
		if _, err := devices.Verify(dt, carla, never); err != nil {
			t.Errorf("device token issued %s, no revocation: %v", tt.name, err)
		}
		h := RequireAccount(tokens, revocations{"acct-carla": revokedAt})(func(c echo.Context) error { return nil })
		req := httptest.NewRequest("GET", "/", nil)
		req.Header.Set("Authorization", "Bearer "+at)
		if err := h(echo.New().NewContext(req, httptest.NewRecorder())); (err == nil) != tt.ok {
			t.Errorf("access token issued %s the revocation: err %v, want honoured %v", tt.name, err, tt.ok)
		}
	}
}

// TestOlderTokensAreReadOnTheStrictSide: a token from before iat_us counts from the start of its
// iat_ms millisecond, and one from before iat_ms from the start of its iat second: refused by a
// revocation later in that unit, honoured after it.
func TestOlderTokensAreReadOnTheStrictSide(t *testing.T) {
	tokens, _ := NewTokens(secret, time.Hour)
	revokedAt := time.Date(2026, 11, 30, 12, 0, 0, 700_200_000, time.UTC)
	for _, tt := range []struct {
		name   string
		ms     bool // the token carries iat_ms (else iat alone)
		issued time.Time
		ok     bool
	}{
		{"whole seconds, later in the revocation's second", false, revokedAt.Add(200 * time.Millisecond), false},
		{"whole seconds, the next second", false, revokedAt.Add(300 * time.Millisecond), true},
		{"milliseconds, later in the revocation's millisecond", true, revokedAt.Add(500 * time.Microsecond), false},
		{"milliseconds, the next millisecond", true, revokedAt.Add(900 * time.Microsecond), true},
	} {
		c := claims{RegisteredClaims: jwt.RegisteredClaims{Subject: "acct-carla", ID: "x",
			IssuedAt: jwt.NewNumericDate(tt.issued), ExpiresAt: jwt.NewNumericDate(tt.issued.Add(time.Hour))},
			Payer: "p", Person: "PF"}
		if tt.ms {
			c.IssuedMs = tt.issued.UnixMilli()
		}
		tokens.now = func() time.Time { return tt.issued }
		raw, err := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString(tokens.secret)
		if err != nil {
			t.Fatal(err)
		}
		s, err := tokens.Verify(raw)
		if err != nil {
			t.Fatal(err)
		}
		if got := !revokedBy(s.IssuedAt, revokedAt); got != tt.ok {
			t.Errorf("%s (%s): honoured %v, want %v", tt.name, tt.issued.Format(time.StampMicro), got, tt.ok)
		}
	}
}

type revocations map[string]time.Time

func (r revocations) RevokedSince(account string) time.Time { return r[account] }
func (r revocations) RemovedSince(string, string) time.Time { return time.Time{} }

// never is a device's revocation time when it was never revoked nor removed.
func never(string) time.Time { return time.Time{} }

// TestALoweredLifetimeEndsOlderTokens: a token's exp was stamped under the lifetime of its day;
// once DEVICE_TTL or TOKEN_TTL is lowered, a token older than the new lifetime is refused too,
// as the ledger keeps the removals and revocations that refuse tokens for that long only (a
// removed device's 48-hour-old token, issued under 720h, trusted again under 1h, before).
func TestALoweredLifetimeEndsOlderTokens(t *testing.T) {
	issued := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	then, err := NewDevices(secret, 720*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	then.now = func() time.Time { return issued }
	deviceToken, err := then.Issue("52998224725", "old-phone", issued)
	if err != nil {
		t.Fatal(err)
	}
	oldTokens, err := NewTokens(secret, 720*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	oldTokens.now = then.now
	access, err := oldTokens.Issue(Subject{Account: "acct-ana", Payer: "p", Person: "PF", Device: "old-phone", IssuedAt: issued})
	if err != nil {
		t.Fatal(err)
	}
	none := func(string) time.Time { return time.Time{} }
	for _, tt := range []struct {
		ttl   time.Duration
		valid bool
	}{{720 * time.Hour, true}, {time.Hour, false}} {
		now := func() time.Time { return issued.Add(48 * time.Hour) }
		devices, err := NewDevices(secret, tt.ttl)
		if err != nil {
			t.Fatal(err)
		}
		devices.now = now
		_, derr := devices.Verify(deviceToken, "52998224725", none)
		tokens, err := NewTokens(secret, tt.ttl)
		if err != nil {
			t.Fatal(err)
		}
		tokens.now = now
		_, terr := tokens.Verify(access)
		if got := derr == nil; got != tt.valid {
			t.Errorf("a 48-hour-old device token under a lifetime of %v: valid %v, want %v", tt.ttl, got, tt.valid)
		}
		if got := terr == nil; got != tt.valid {
			t.Errorf("a 48-hour-old access token under a lifetime of %v: valid %v, want %v", tt.ttl, got, tt.valid)
		}
	}
}
