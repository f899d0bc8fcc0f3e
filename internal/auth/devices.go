package auth

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// Devices issues and verifies device tokens, OWASP's device cookies: a successful login hands
// the client a token naming a random device id and the document it logged into, and a later
// login into that document that presents it is counted against the device's own rate-limit key
// instead of the document's. So a botnet that fills a customer's document key does not lock her
// out on the phone she used before, and a stolen token buys an attacker one device's budget.
//
// A device token is an HS256 JWT signed with a key derived from AUTH_SECRET for this purpose
// alone (DeriveKey "device tokens"), so it is never an access token, nor an access token a device
// token. It carries no CPF: the document is bound by a keyed hash of it (HMAC under another
// derived key), compared in constant time.
type Devices struct {
	signing, binding []byte
	ttl              time.Duration
	now              func() time.Time
}

// ErrNoDevice means a device token is absent, malformed, forged, expired or for another
// document: the login counts against the document key, and nobody is told why.
var ErrNoDevice = errors.New("no trusted device")

type deviceClaims struct {
	jwt.RegisteredClaims
	// Document is HMAC-SHA256(binding key, document), base64url: the document it logs into.
	Document string `json:"doc"`
	// IssuedUs and IssuedMs are the issue time, as an access token's (claims.IssuedUs).
	IssuedUs int64 `json:"iat_us,omitempty"`
	IssuedMs int64 `json:"iat_ms,omitempty"`
}

// NewDevices returns Devices deriving its keys from secret (at least 32 bytes), with tokens
// valid for ttl.
func NewDevices(secret []byte, ttl time.Duration) (*Devices, error) {
	if err := checkIssuer("device token", secret, ttl); err != nil {
		return nil, err
	}
	return &Devices{signing: DeriveKey(secret, "device tokens"), binding: DeriveKey(secret, "device documents"),
		ttl: ttl, now: time.Now}, nil
}

// TTL is how long an issued device token stays valid.
func (d *Devices) TTL() time.Duration { return d.ttl }

// Issue returns a device token for document: for device when it is not empty (a known device
// logging in again keeps its id and gets a fresh lifetime), else for a new random device. at is
// its issue time (zero: now), read by the login from the ledger's clock, as the access token's.
func (d *Devices) Issue(document, device string, at time.Time) (string, error) {
	if device == "" {
		device = rand.Text()
	}
	now := at
	if now.IsZero() {
		now = d.now()
	}
	claims := deviceClaims{IssuedUs: now.UnixMicro(), IssuedMs: now.UnixMilli(),
		RegisteredClaims: jwt.RegisteredClaims{ID: device, IssuedAt: jwt.NewNumericDate(now), ExpiresAt: jwt.NewNumericDate(now.Add(d.ttl))},
		Document:         d.bind(document),
	}
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString(d.signing)
	if err != nil {
		return "", fmt.Errorf("auth: sign device token: %w", err)
	}
	return s, nil
}

// Verify returns the device id of a valid token for document, or ErrNoDevice for anything else:
// a token issued before since(its device) (when support revoked the devices of the document's
// holder, or the owner removed that device; zero: never) is no device either (revokedBy).
func (d *Devices) Verify(token, document string, since func(device string) time.Time) (string, error) {
	claims, ok := d.parse(token)
	if !ok || !hmac.Equal([]byte(claims.Document), []byte(d.bind(document))) || claims.IssuedAt == nil {
		return "", ErrNoDevice
	}
	if at := issuedAt(claims.IssuedAt, claims.IssuedUs, claims.IssuedMs); revokedBy(at, since(claims.ID)) || outlived(at, d.ttl, d.now()) {
		return "", ErrNoDevice
	}
	return claims.ID, nil
}

// parse reads a token signed with the devices' key, unexpired, naming a device.
func (d *Devices) parse(token string) (deviceClaims, bool) {
	var claims deviceClaims
	if token == "" || len(token) > 1024 {
		return claims, false
	}
	_, err := jwt.ParseWithClaims(token, &claims, func(*jwt.Token) (any, error) { return d.signing, nil },
		jwt.WithValidMethods([]string{jwt.SigningMethodHS256.Alg()}),
		jwt.WithExpirationRequired(),
		jwt.WithStrictDecoding(), // as Tokens.Verify
		jwt.WithTimeFunc(d.now),
	)
	return claims, err == nil && claims.ID != ""
}

func (d *Devices) bind(document string) string {
	m := hmac.New(sha256.New, d.binding)
	m.Write([]byte(document))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}
