package auth

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/pixlimit/pixlimit/internal/pix"
)

// subjectKey keys the verified subject in a request's context: a type of its own, so that
// nothing but RequireAccount can set it and nothing but SubjectOf reads it.
type subjectKey struct{}

// Revocations says when support last revoked an account's devices, and when its owner last
// removed one device (zero: never). The tokens issued before, access and device tokens alike,
// are no longer honoured.
type Revocations interface {
	RevokedSince(account string) time.Time
	RemovedSince(account, device string) time.Time
}

// RequireAccount is middleware that admits only requests bearing a valid access token
// ("Authorization: Bearer <token>") issued after its account's last revocation (revoked may be
// nil: none), and records the token's subject for SubjectOf. Anything else is ErrUnauthorized,
// for the error handler to answer 401.
func RequireAccount(tokens *Tokens, revoked Revocations) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			scheme, token, ok := strings.Cut(Authorization(c.Request()), " ")
			if !ok || !strings.EqualFold(scheme, "Bearer") {
				return ErrUnauthorized
			}
			s, err := tokens.Verify(strings.TrimSpace(token))
			if err != nil {
				return err
			}
			if revoked != nil && (revokedBy(s.IssuedAt, revoked.RevokedSince(s.Account)) ||
				s.Device != "" && revokedBy(s.IssuedAt, revoked.RemovedSince(s.Account, s.Device))) {
				return ErrUnauthorized
			}
			// The account's ledger calls take its customer's places (pix.ForCustomer), which her
			// logins take too.
			ctx := pix.ForCustomer(context.WithValue(c.Request().Context(), subjectKey{}, s), s.Payer)
			c.SetRequest(c.Request().WithContext(ctx))
			return next(c)
		}
	}
}

// Authorization is r's one Authorization header, or "" when it sends none or several: a request
// with two is ambiguous (a proxy may read one, the API another), so it is no one's.
func Authorization(r *http.Request) string {
	if vs := r.Header.Values(echo.HeaderAuthorization); len(vs) == 1 {
		return vs[0]
	}
	return ""
}

// AccountID is the account that RequireAccount authenticated, for handlers and key functions
// behind it.
func AccountID(c echo.Context) (string, error) {
	s, err := SubjectOf(c)
	return s.Account, err
}

// SubjectOf is the subject of the token RequireAccount verified: the account and its holder.
func SubjectOf(c echo.Context) (Subject, error) {
	s, ok := c.Request().Context().Value(subjectKey{}).(Subject)
	if !ok || s.Account == "" {
		return Subject{}, ErrUnauthorized
	}
	return s, nil
}
