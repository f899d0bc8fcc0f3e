package httpapi

import (
	"context"
	"errors"
	"math"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/pixlimit/pixlimit/internal/auth"
	"github.com/pixlimit/pixlimit/internal/dict"
	"github.com/pixlimit/pixlimit/internal/pix"
	"github.com/pixlimit/pixlimit/internal/ratelimit"
)

// handleLookup shows the payer who owns a PIX key before paying: a person's name abbreviated
// as banks show it and the document masked, a company's name and CNPJ in full (both are public
// in the Receita Federal's register), or 404. It is limited by the anti-scan buckets. The key is
// percent-decoded once, then validated: bruno%40example.com is bruno@example.com.
func handleLookup(ledger pix.Payments, share *pix.Share, lookups buckets) echo.HandlerFunc {
	type response struct {
		Key         string `json:"key"`
		Name        string `json:"name"`
		Document    string `json:"document"`
		Institution string `json:"institution"`
	}
	return func(c echo.Context) error {
		s, err := auth.SubjectOf(c)
		if err != nil {
			return err
		}
		// Echo's c.Param is the escaped segment when the path needed escaping and the decoded one
		// when it did not (bruno%2540 arrives as bruno%40): decode the escaped path, once.
		raw, err := url.PathUnescape(strings.TrimPrefix(c.Request().URL.EscapedPath(), strings.TrimSuffix(c.Path(), ":key")))
		if err != nil {
			return invalid("invalid PIX key", map[string]string{"key": "malformed percent-encoding"})
		}
		key, keyType, err := pix.ParseKey(raw)
		if err != nil {
			return invalid("invalid PIX key", map[string]string{"key": err.Error()})
		}
		user, bank := lookups.bucket(s, keyType), lookups.bank()
		asked, step := lookups.askAll(c.Request().Context(), user, bank)
		if err := lookups.answerAsk(c, user, bank, false, asked, step); err != nil {
			return err
		}
		p, err := lookupKey(c.Request().Context(), ledger, share, s.Account, key)
		switch {
		case errors.Is(err, pix.ErrKeyNotFound):
			if err := lookups.charge(c, user, false, ""); err != nil {
				return err
			}
		case err == nil:
			if err := lookups.charge(c, user, true, dict.Voucher(lookups.payer(s), key)); err != nil {
				return err
			}
		}
		if err != nil {
			return err
		}
		name, document := abbreviate(p.Name), maskCPF(p.Document)
		if pix.PersonOf(p.Document) == pix.PJ {
			name, document = p.Name, pix.FormatDocument(p.Document)
		}
		return c.JSON(http.StatusOK, response{Key: p.Key, Name: name, Document: document,
			Institution: "pixlimit (ISPB " + pix.ISPB + ")"})
	}
}

// lookupKey looks key up in one of account's places of share (nil: none): the key names no
// account for the ledger to count it against.
func lookupKey(ctx context.Context, ledger pix.Payments, share *pix.Share, account, key string) (pix.Payee, error) {
	if share != nil {
		held, release, err := share.Hold(ctx, account, math.MaxInt64) // the share's own wait bounds it
		if err != nil {
			return pix.Payee{}, err
		}
		defer release()
		ctx = held
	}
	return ledger.LookupKey(ctx, key)
}

// handleLookupLimits shows the payer its own look-up buckets and the bank's DICT category, as
// DICT's GET /policies shows a participant its own: available tokens, capacity, refill. It asks
// each bucket without taking anything, and shows no other customer's state (nor the bank's
// bucket: its level tells how busy the bank is).
func handleLookupLimits(lookups buckets) echo.HandlerFunc {
	type policy struct {
		Name                string `json:"name"`
		AvailableTokens     int    `json:"available_tokens"`
		Capacity            int    `json:"capacity"`
		RefillTokens        int    `json:"refill_tokens"`
		RefillPeriodSeconds int64  `json:"refill_period_seconds"`
	}
	type response struct {
		Category string   `json:"category"`
		Policies []policy `json:"policies"`
	}
	return func(c echo.Context) error {
		s, err := auth.SubjectOf(c)
		if err != nil {
			return err
		}
		resp := response{Category: lookups.category, Policies: []policy{}}
		for _, t := range []pix.KeyType{pix.KeyEmail, pix.KeyCPF} {
			chk := lookups.bucket(s, t)
			ds, err := lookups.decider().Decide(c.Request().Context(), ratelimit.AskStep(chk.Check))
			d := ds.Last()
			if err != nil {
				return &Error{Code: CodeRateLimiterUnavailable, RetryAfter: lookups.failClosedRetryAfter, cause: err}
			}
			p := chk.Policy
			resp.Policies = append(resp.Policies, policy{Name: p.Name, AvailableTokens: d.Worst.Remaining, Capacity: p.Burst,
				RefillTokens: p.Limit, RefillPeriodSeconds: int64(p.Window / time.Second)})
		}
		return c.JSON(http.StatusOK, resp)
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
