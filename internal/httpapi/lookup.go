package httpapi

import (
	"errors"
	"log/slog"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/pixlimit/pixlimit/internal/auth"
	"github.com/pixlimit/pixlimit/internal/pix"
	"github.com/pixlimit/pixlimit/internal/ratelimit"
)

// lookupLimiter is the key look-up's anti-scan bucket, after the central bank's DICT policy for
// individuals: a look-up takes one token to be answered at all (none left: 429), and one that
// finds no key is then charged the rest of the miss cost. A customer who types keys correctly
// spends one token a look-up and barely notices; a scanner pays twenty per miss and is down to
// one miss per ten minutes once its hundred tokens are gone.
type lookupLimiter struct {
	limiter
	policy   ratelimit.Policy
	missCost int
	logger   *slog.Logger
}

// charge takes tokens from account's bucket after the answer; with report, the response's
// RateLimit headers show the bucket after the charge. A charge that cannot reach Redis is
// logged: the answer is already decided.
func (l lookupLimiter) charge(c echo.Context, account string, tokens int, report bool) {
	if tokens < 1 {
		return
	}
	d, err := l.l.Charge(c.Request().Context(), ratelimit.Check{Policy: l.policy, Identity: account}, tokens)
	if err != nil {
		l.logger.Warn("could not charge the key look-up bucket", "policy", l.policy.Name, "err", err)
		return
	}
	if report {
		setHeaders(c.Response().Header(), d)
	}
}

// handleLookup shows the payer who owns a PIX key before paying: the holder's name abbreviated
// as banks show it and the document masked, or 404. It is limited by the anti-scan bucket.
func handleLookup(ledger pix.Ledger, lookups lookupLimiter) echo.HandlerFunc {
	type response struct {
		Key         string `json:"key"`
		Name        string `json:"name"`
		Document    string `json:"document"`
		Institution string `json:"institution"`
	}
	return func(c echo.Context) error {
		account, err := auth.AccountID(c)
		if err != nil {
			return err
		}
		key, _, err := pix.ParseKey(c.Param("key"))
		if err != nil {
			return invalid("invalid PIX key", map[string]string{"key": err.Error()})
		}
		if err := lookups.enforce(c, nil, ratelimit.Check{Policy: lookups.policy, Identity: account}); err != nil {
			return err
		}
		p, err := ledger.LookupKey(c.Request().Context(), key)
		if errors.Is(err, pix.ErrKeyNotFound) {
			lookups.charge(c, account, lookups.missCost-1, true) // the decision took one token
		}
		if err != nil {
			return err
		}
		return c.JSON(http.StatusOK, response{Key: p.Key, Name: abbreviate(p.Name), Document: maskCPF(p.Document),
			Institution: "pixlimit (ISPB " + pix.ISPB + ")"})
	}
}

// abbreviate shows a holder's name as banks do: the first name and the last name's initial,
// "Bruno Lima" as "Bruno L.".
func abbreviate(name string) string {
	parts := strings.Fields(name)
	if len(parts) < 2 {
		return name
	}
	last := []rune(parts[len(parts)-1])
	return parts[0] + " " + string(last[0]) + "."
}

// maskCPF shows the middle six digits of a CPF only: "39053344705" as "***.533.447-**".
func maskCPF(cpf string) string {
	if len(cpf) != 11 {
		return "***.***.***-**"
	}
	return "***." + cpf[3:6] + "." + cpf[6:9] + "-**"
}
