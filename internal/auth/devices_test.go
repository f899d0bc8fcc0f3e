package auth

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

func TestDevices(t *testing.T) {
	devices, err := NewDevices(secret, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	devices.now = func() time.Time { return now }
	const carla, ana = "11144477735", "52998224725"
	tok, err := devices.Issue(carla, "")
	if err != nil {
		t.Fatal(err)
	}
	device, err := devices.Verify(tok, carla)
	if err != nil || device == "" {
		t.Fatalf("Verify(issued) = %q, %v", device, err)
	}
	if strings.Contains(tok, carla) {
		t.Error("the token carries the CPF in clear")
	}
	again, _ := devices.Issue(carla, device)
	if d, err := devices.Verify(again, carla); err != nil || d != device {
		t.Errorf("a re-issued token names device %q, %v; want the same %q", d, err, device)
	}
	other, _ := NewDevices([]byte("another-secret-another-secret-xx"), time.Hour)
	fromOther, _ := other.Issue(carla, "")
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
		"empty":                 {"", carla},
		"garbage":               {"not.a.token", carla},
		"oversized":             {strings.Repeat("a", 2000), carla},
		"another secret's doc":  {fromOther, ana},
		"a document that is no": {tok, ""},
	} {
		if d, err := devices.Verify(tt.token, tt.document); !errors.Is(err, ErrNoDevice) {
			t.Errorf("%s: Verify = %q, %v; want ErrNoDevice", name, d, err)
		}
	}
	now = now.Add(time.Hour + time.Second)
	if _, err := devices.Verify(tok, carla); !errors.Is(err, ErrNoDevice) {
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
	good, _ := devices.Issue("11144477735", want)
	for _, s := range []string{good, "", "a.b.c", good + "x", strings.ToUpper(good), "eyJhbGciOiJub25lIn0.e30."} {
		f.Add(s, "11144477735")
	}
	f.Fuzz(func(t *testing.T, token, document string) {
		device, err := devices.Verify(token, document)
		// (Base64 accepts a few spellings of the same signature: what matters is what is trusted.)
		if err == nil && (document != "11144477735" || device != want) {
			t.Fatalf("Verify(%q, %q) trusted device %q", token, document, device)
		}
	})
}
