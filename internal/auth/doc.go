// Package auth owns who is asking: the client's IP address as the rate limiter sees it, the
// password check of a login, the access tokens that name an account afterwards, and the keys
// derived from the process's secret.
package auth
