package httpapi

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/pixlimit/pixlimit/internal/auth"
	"github.com/pixlimit/pixlimit/internal/pix"
	"github.com/pixlimit/pixlimit/internal/ratelimit"
)

// lookupLimiter is the key look-up's anti-scan bucket, after the central bank's DICT policy for
// individuals: a look-up is answered while the bucket holds a token (none left: 429), and costs 1
// if it finds the key and LookupMissCost if not. It asks the bucket before the ledger (a refused
// look-up costs no query) and pays its price, admission and payment in one atomic step
// (ratelimit.Limiter.AllowN), before it answers: look-ups sent together cannot buy more answers
// than the same look-ups one by one. A customer who types keys correctly spends one token a
// look-up and barely notices; a scanner pays twenty per miss and is down to one miss per ten
// minutes once its hundred tokens are gone.
type lookupLimiter struct {
	limiter
	limit    Limit
	missCost int
}

// pay decides a request of account that costs tokens (0: whether one would be admitted) on the
// bucket as limit says (its fail mode decides when Redis cannot), or refuses it (429) when the
// bucket holds no token. With quiet, an admission sets no RateLimit headers (a PIX reports its
// own policy); a refusal always reports the bucket.
func (l lookupLimiter) pay(c echo.Context, limit Limit, account string, tokens int, quiet bool) error {
	rc := ratelimit.Check{Policy: limit.Policy, Identity: account}
	report := func(d ratelimit.Decision) ratelimit.Decision {
		if quiet && d.Allowed {
			return ratelimit.Decision{Allowed: true}
		}
		return d
	}
	return l.apply(c, report, []check{{limit, account}}, func(ctx context.Context) (ratelimit.Decision, error) {
		return l.l.AllowN(ctx, rc, tokens)
	})
}

// consultLookups is the PIX's side of the anti-scan bucket: a PIX to a key nobody has answers 404
// as a look-up does, so it is paid for like one, or PIX would be the way to enumerate keys once
// look-ups are refused. Before the PIX's own limit, it asks the bucket, taking nothing: while the
// bucket holds no token the PIX is refused (429, policy pix-lookup) whether or not its key
// exists, and the PIX's own limit records nothing. A PIX to a key nobody has then pays the miss,
// admitted and paid at once, before its 404 is sent (refused, it is a 429 instead); a payment to
// a found key costs the bucket nothing. A bucket that cannot be asked (Redis down) leaves the
// PIX to its own limit's fail mode.
func consultLookups(lookups lookupLimiter) echo.MiddlewareFunc {
	asked := lookups.limit
	asked.FailMode = FailOpen // Redis down: the PIX's own limit answers, by its own fail mode
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			account, err := auth.AccountID(c)
			if err != nil {
				return err
			}
			if err := lookups.pay(c, asked, account, 0, true); err != nil {
				return err
			}
			err = next(c)
			if errors.Is(err, pix.ErrKeyNotFound) {
				if payErr := lookups.pay(c, lookups.limit, account, lookups.missCost, true); payErr != nil {
					return payErr
				}
			}
			return err
		}
	}
}

// handleLookup shows the payer who owns a PIX key before paying: the holder's name abbreviated
// as banks show it and the document masked, or 404. It is limited by the anti-scan bucket. The
// key is percent-decoded once, then validated: bruno%40example.com is bruno@example.com.
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
		// Echo's c.Param is the escaped segment when the path needed escaping and the decoded one
		// when it did not (bruno%2540 arrives as bruno%40): decode the escaped path, once.
		raw, err := url.PathUnescape(strings.TrimPrefix(c.Request().URL.EscapedPath(), strings.TrimSuffix(c.Path(), ":key")))
		if err != nil {
			return invalid("invalid PIX key", map[string]string{"key": "malformed percent-encoding"})
		}
		key, _, err := pix.ParseKey(raw)
		if err != nil {
			return invalid("invalid PIX key", map[string]string{"key": err.Error()})
		}
		if err := lookups.pay(c, lookups.limit, account, 0, false); err != nil {
			return err
		}
		p, err := ledger.LookupKey(c.Request().Context(), key)
		switch {
		case errors.Is(err, pix.ErrKeyNotFound):
			if err := lookups.pay(c, lookups.limit, account, lookups.missCost, false); err != nil {
				return err
			}
		case err == nil:
			if err := lookups.pay(c, lookups.limit, account, 1, false); err != nil {
				return err
			}
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
