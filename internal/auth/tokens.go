package auth

import (
	"crypto/rand"
	"errors"
	"fmt"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// ErrUnauthorized means a request carried no valid access token.
var ErrUnauthorized = errors.New("missing, invalid or expired access token")

// Tokens issues and verifies access tokens: HS256 JWTs whose subject is the account id, with an
// expiry and a unique id (jti). Every replica that shares the secret accepts every replica's
// tokens.
type Tokens struct {
	secret []byte
	ttl    time.Duration
	now    func() time.Time
}

// NewTokens returns Tokens signing with a key derived from secret (at least 32 bytes) for access
// tokens alone, valid for ttl.
func NewTokens(secret []byte, ttl time.Duration) (*Tokens, error) {
	if len(secret) < 32 {
		return nil, fmt.Errorf("auth: token secret of %d bytes: want at least 32", len(secret))
	}
	if ttl <= 0 {
		return nil, errors.New("auth: token lifetime must be positive")
	}
	return &Tokens{secret: DeriveKey(secret, "access tokens"), ttl: ttl, now: time.Now}, nil
}

// TTL is how long an issued token stays valid.
func (t *Tokens) TTL() time.Duration { return t.ttl }

// Issue returns a signed token for the account.
func (t *Tokens) Issue(accountID string) (string, error) {
	now := t.now()
	claims := jwt.RegisteredClaims{
		Subject:   accountID,
		IssuedAt:  jwt.NewNumericDate(now),
		ExpiresAt: jwt.NewNumericDate(now.Add(t.ttl)),
		ID:        rand.Text(),
	}
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString(t.secret)
	if err != nil {
		return "", fmt.Errorf("auth: sign token: %w", err)
	}
	return s, nil
}

// Verify returns the account id of a valid token. Only HS256 is accepted, whatever the token's
// header claims: "alg": "none" and algorithm-confusion tokens fail here, as do bad signatures,
// tokens without an expiry and expired ones.
func (t *Tokens) Verify(token string) (string, error) {
	var claims jwt.RegisteredClaims
	_, err := jwt.ParseWithClaims(token, &claims, func(*jwt.Token) (any, error) { return t.secret, nil },
		jwt.WithValidMethods([]string{jwt.SigningMethodHS256.Alg()}),
		jwt.WithExpirationRequired(),
		jwt.WithTimeFunc(t.now),
	)
	if err != nil || claims.Subject == "" {
		return "", ErrUnauthorized
	}
	return claims.Subject, nil
}
