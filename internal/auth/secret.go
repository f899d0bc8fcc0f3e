package auth

import (
	"crypto/hmac"
	"crypto/sha256"
)

// RateLimitKey is the rate limiter's key-hashing secret (ratelimit.Options.KeySecret), derived
// from the process's secret: every replica of a fleet must derive the same one.
func RateLimitKey(secret []byte) []byte { return DeriveKey(secret, "ratelimit keys") }

// DeriveKey derives from the process's secret (AUTH_SECRET) the key of one purpose, such as
// "ratelimit keys": one variable configures every key, and no key can be computed from another
// key's use. Every key is derived: the rate limiter's, the device tokens' two and the access
// tokens' (NewTokens). HMAC-SHA256(secret, "pixlimit " + purpose + " v1"), 32 bytes.
func DeriveKey(secret []byte, purpose string) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("pixlimit " + purpose + " v1"))
	return m.Sum(nil)
}
