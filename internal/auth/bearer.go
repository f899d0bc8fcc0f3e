package auth

import (
	"strings"

	"github.com/labstack/echo/v4"
)

const accountKey = "pixlimit.account"

// RequireAccount is middleware that admits only requests bearing a valid access token
// ("Authorization: Bearer <token>") and records the token's account for AccountID. Anything else
// is ErrUnauthorized, for the error handler to answer 401.
func RequireAccount(tokens *Tokens) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			scheme, token, ok := strings.Cut(c.Request().Header.Get(echo.HeaderAuthorization), " ")
			if !ok || !strings.EqualFold(scheme, "Bearer") {
				return ErrUnauthorized
			}
			s, err := tokens.Verify(strings.TrimSpace(token))
			if err != nil {
				return err
			}
			c.Set(accountKey, s)
			return next(c)
		}
	}
}

// AccountID is the account that RequireAccount authenticated, for handlers and key functions
// behind it.
func AccountID(c echo.Context) (string, error) {
	s, err := SubjectOf(c)
	return s.Account, err
}

// SubjectOf is the subject of the token RequireAccount verified: the account and its holder.
func SubjectOf(c echo.Context) (Subject, error) {
	s, ok := c.Get(accountKey).(Subject)
	if !ok || s.Account == "" {
		return Subject{}, ErrUnauthorized
	}
	return s, nil
}
