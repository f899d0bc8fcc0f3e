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

// ErrUnauthorized means a request carried no valid access token.
var ErrUnauthorized = errors.New("missing, invalid or expired access token")

// Tokens issues and verifies access tokens: HS256 JWTs whose subject is the account id, with an
// expiry, a unique id (jti) and the payer the account belongs to (Subject). Every replica that
// shares the secret accepts every replica's tokens.
type Tokens struct {
	secret []byte
	payers []byte // the key of PayerID
	ttl    time.Duration
	now    func() time.Time
}

// Subject is who an access token speaks for: an account, and the person who holds it.
type Subject struct {
	// Account is the account's id.
	Account string
	// Payer identifies the holder's document (CPF or CNPJ) without revealing it: PayerID of the
	// document. Limits that follow a person across their accounts (the DICT anti-scan buckets,
	// keyed by DICT's PI-PayerId) are keyed by it, and no document travels in clear inside a
	// token anyone holding it can decode.
	Payer string
	// Person is "PF" (a natural person) or "PJ" (a company).
	Person string
	// ID is the token's own unique id (its jti; Verify's, Issue draws one): what a stolen token's
	// password guesses are counted against, so that they cost the owner's next login nothing.
	ID string
	// Device is the id of the device the login came from (its device token's), a fresh one for
	// a new device: what the new-device money caps and registration key on.
	Device string
	// IssuedAt is when the token was issued, to the microsecond: Issue stamps it (zero: now),
	// read from the ledger's clock by the login, so that a revocation of the account's devices
	// (Revocations), stamped by the same clock, refuses exactly the tokens issued before it.
	IssuedAt time.Time
}

// claims are an access token's: the registered ones, and the Subject's payer and person.
type claims struct {
	jwt.RegisteredClaims
	Payer  string `json:"pyr"`
	Person string `json:"per"`
	Device string `json:"dev"`
	// IssuedUs is the issue time in Unix microseconds, as the ledger's clock stamps a
	// revocation: a JWT's iat counts whole seconds, and a login answered just after a revocation
	// must be told apart from one before it. IssuedMs, in milliseconds, is what tokens carried
	// before it (still read, and still written for replicas that read nothing else).
	IssuedUs int64 `json:"iat_us,omitempty"`
	IssuedMs int64 `json:"iat_ms,omitempty"`
}

// NewTokens returns Tokens signing with a key derived from secret (at least 32 bytes) for access
// tokens alone, valid for ttl.
func NewTokens(secret []byte, ttl time.Duration) (*Tokens, error) {
	if err := checkIssuer("access token", secret, ttl); err != nil {
		return nil, err
	}
	return &Tokens{secret: DeriveKey(secret, "access tokens"), payers: DeriveKey(secret, "payer ids"), ttl: ttl, now: time.Now}, nil
}

// PayerID is the opaque, stable name of a document (as pix.ParseDocument returns it): 22
// characters of HMAC-SHA256 under a key derived from the secret, the same on every replica.
// A support desk that knows a customer's CPF computes it to find her buckets.
func (t *Tokens) PayerID(document string) string {
	m := hmac.New(sha256.New, t.payers)
	m.Write([]byte(document))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))[:22]
}

// TTL is how long an issued token stays valid.
func (t *Tokens) TTL() time.Duration { return t.ttl }

// Issue returns a signed token for the subject.
func (t *Tokens) Issue(s Subject) (string, error) {
	if s.Account == "" || s.Payer == "" || (s.Person != "PF" && s.Person != "PJ") {
		return "", fmt.Errorf("auth: a token for %q needs its account, payer and person", s.Account)
	}
	now := s.IssuedAt
	if now.IsZero() {
		now = t.now()
	}
	c := claims{IssuedUs: now.UnixMicro(), IssuedMs: now.UnixMilli(), RegisteredClaims: jwt.RegisteredClaims{
		Subject:   s.Account,
		IssuedAt:  jwt.NewNumericDate(now),
		ExpiresAt: jwt.NewNumericDate(now.Add(t.ttl)),
		ID:        rand.Text(),
	}, Payer: s.Payer, Person: s.Person, Device: s.Device}
	token, err := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString(t.secret)
	if err != nil {
		return "", fmt.Errorf("auth: sign token: %w", err)
	}
	return token, nil
}

// Verify returns the subject of a valid token. Only HS256 is accepted, whatever the token's
// header claims: "alg": "none" and algorithm-confusion tokens fail here, as do bad signatures,
// tokens without an expiry, expired ones and ones without a payer and person. Each part is
// decoded strictly (canonical base64url): a token whose signature's last character is changed in
// its unused bits decodes to the same bytes, and would pass as a different string.
func (t *Tokens) Verify(token string) (Subject, error) {
	if len(token) > maxTokenLen { // read before anyone is known: no client makes the API decode and hash a megabyte
		return Subject{}, ErrUnauthorized
	}
	var c claims
	_, err := jwt.ParseWithClaims(token, &c, func(*jwt.Token) (any, error) { return t.secret, nil },
		jwt.WithValidMethods([]string{jwt.SigningMethodHS256.Alg()}),
		jwt.WithExpirationRequired(),
		jwt.WithStrictDecoding(),
		jwt.WithTimeFunc(t.now),
	)
	if err != nil || c.Subject == "" || c.Payer == "" || (c.Person != "PF" && c.Person != "PJ") || c.IssuedAt == nil {
		return Subject{}, ErrUnauthorized
	}
	at := issuedAt(c.IssuedAt, c.IssuedUs, c.IssuedMs)
	if outlived(at, t.ttl, t.now()) {
		return Subject{}, ErrUnauthorized
	}
	return Subject{Account: c.Subject, Payer: c.Payer, Person: c.Person, Device: c.Device, ID: c.ID, IssuedAt: at}, nil
}

// outlived says whether a token issued at iat has lived past ttl, the lifetime configured now:
// its exp was stamped under the lifetime of its day, and a lifetime lowered since (TOKEN_TTL,
// DEVICE_TTL) must end it too, as the ledger keeps the removals and revocations that refuse
// tokens for the lifetime configured now, no longer.
func outlived(iat time.Time, ttl time.Duration, now time.Time) bool { return now.After(iat.Add(ttl)) }

// maxTokenLen bounds an access token: Issue's are a few hundred bytes (TestTokensAreShort).
const maxTokenLen = 2048

// issuedAt is a token's issue time: its microseconds, else its milliseconds (a token from before
// iat_us), when it carries them and they agree with its iat, else iat's whole second (a token
// from before iat_ms, or a mismatch): the coarser, the stricter revokedBy is with it.
func issuedAt(iat *jwt.NumericDate, us, ms int64) time.Time {
	sec := iat.UTC().Truncate(time.Second)
	for _, at := range []time.Time{time.UnixMicro(us).UTC(), time.UnixMilli(ms).UTC()} {
		if at.Unix() > 0 && at.Truncate(time.Second).Equal(sec) {
			return at
		}
	}
	return sec
}

// revokedBy reports whether a token issued at iat falls under a revocation made at since (zero:
// none): a token issued before the revocation, or in its own microsecond, is refused; one issued
// after it is honoured. Both times come from the ledger's clock, which counts microseconds. A
// token stamped in milliseconds or whole seconds (from before iat_us or iat_ms) counts from the
// start of its millisecond or second: the strict side.
func revokedBy(iat, since time.Time) bool {
	return !since.IsZero() && !iat.After(since)
}

// checkIssuer checks what makes a token issuer (what names it): a secret of at least 32 bytes and
// a positive lifetime.
func checkIssuer(what string, secret []byte, ttl time.Duration) error {
	if len(secret) < 32 {
		return fmt.Errorf("auth: %s secret of %d bytes: want at least 32", what, len(secret))
	}
	if ttl <= 0 {
		return fmt.Errorf("auth: %s lifetime must be positive", what)
	}
	return nil
}
