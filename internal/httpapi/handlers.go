package httpapi

import (
	"context"
	"net/http"
	"regexp"
	"strconv"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/labstack/echo/v4"

	"github.com/pixlimit/pixlimit/internal/auth"
	"github.com/pixlimit/pixlimit/internal/pix"
	"github.com/pixlimit/pixlimit/internal/ratelimit"
)

func handleHealthz() echo.HandlerFunc {
	return func(c echo.Context) error {
		return c.JSON(http.StatusOK, map[string]string{"status": "ok"})
	}
}

// handleReadyz reports whether this replica can do its job: each probe answers within its
// timeout (Redis, else limited routes fail open or closed; the database, if there is one).
func handleReadyz(probes []Probe) echo.HandlerFunc {
	return func(c echo.Context) error {
		body := map[string]string{"status": "ready"}
		status := http.StatusOK
		for _, p := range probes {
			ctx, cancel := context.WithTimeout(c.Request().Context(), p.Timeout)
			body[p.Name] = "up"
			if err := p.Ping(ctx); err != nil {
				body[p.Name], body["status"], status = "down", "degraded", http.StatusServiceUnavailable
			}
			cancel()
		}
		return c.JSON(status, body)
	}
}

// handleLogin checks the client IP and, when the document is a valid CPF, the document too, in
// one limiter decision made before anything else: a refused login costs no bcrypt and reveals
// nothing, and every attempt counts, malformed ones included.
func handleLogin(limiter limiter, byIP, byDocument ratelimit.Policy, accounts auth.AccountFinder, tokens *auth.Tokens) echo.HandlerFunc {
	type request struct {
		Document string `json:"document"`
		Password string `json:"password"`
	}
	type response struct {
		AccessToken string `json:"access_token"`
		TokenType   string `json:"token_type"`
		ExpiresIn   int64  `json:"expires_in"`
		AccountID   string `json:"account_id"`
	}
	return func(c echo.Context) error {
		var req request
		decodeErr := decodeJSON(c, &req)
		addr, err := clientIP(c)
		if err != nil {
			return err
		}
		checks := []ratelimit.Check{{Policy: byIP, Identity: ratelimit.IPIdentity(addr)}}
		document, docErr := pix.ParseCPF(req.Document)
		if decodeErr == nil && docErr == nil {
			checks = append(checks, ratelimit.Check{Policy: byDocument, Identity: document})
		}
		// Unless refused, the headers report the IP key only: the document key would tell anyone
		// how many attempts were made on someone else's CPF, and when.
		ipOnly := func(d ratelimit.Decision) ratelimit.Decision { return d.Only(0) }
		if err := limiter.enforce(c, ipOnly, checks...); err != nil {
			return err
		}
		if decodeErr != nil {
			return decodeErr
		}

		fields := map[string]string{}
		if docErr != nil {
			fields["document"] = "must be a valid CPF: 11 digits, punctuation optional (529.982.247-25)"
		}
		switch {
		case req.Password == "":
			fields["password"] = "required"
		case len(req.Password) > 72:
			fields["password"] = "at most 72 bytes"
		}
		if len(fields) > 0 {
			return invalid("invalid login request", fields)
		}

		acct, err := auth.CheckPassword(c.Request().Context(), accounts, document, req.Password)
		if err != nil {
			return err
		}
		token, err := tokens.Issue(acct.ID)
		if err != nil {
			return err
		}
		return c.JSON(http.StatusOK, response{token, "Bearer", int64(tokens.TTL() / time.Second), acct.ID})
	}
}

var idempotencyKey = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

const maxDescription = 140

func handlePIX(ledger pix.Ledger) echo.HandlerFunc {
	type request struct {
		Key         string `json:"key"`
		AmountCents int64  `json:"amount_cents"`
		Description string `json:"description"`
	}
	type payee struct {
		Key  string `json:"key"`
		Name string `json:"name"`
	}
	type response struct {
		EndToEndID   string    `json:"end_to_end_id"`
		AmountCents  int64     `json:"amount_cents"`
		BalanceCents int64     `json:"balance_cents"`
		To           payee     `json:"to"`
		CreatedAt    time.Time `json:"created_at"`
	}
	return func(c echo.Context) error {
		from, err := auth.AccountID(c)
		if err != nil {
			return err
		}
		var req request
		if err := decodeJSON(c, &req); err != nil {
			return err
		}
		fields := map[string]string{}
		idem := c.Request().Header.Get("Idempotency-Key")
		switch keys := c.Request().Header.Values("Idempotency-Key"); {
		case len(keys) > 1:
			fields["Idempotency-Key"] = "must be sent once" // which one would the client mean?
		case len(keys) == 1 && !idempotencyKey.MatchString(idem):
			fields["Idempotency-Key"] = "must be 1-64 of A-Z a-z 0-9 _ -"
		}
		key, _, err := pix.ParseKey(req.Key)
		if err != nil {
			fields["key"] = err.Error()
		}
		if req.AmountCents <= 0 {
			fields["amount_cents"] = "must be a positive integer number of cents"
		}
		if n := utf8.RuneCountInString(req.Description); n > maxDescription || !printable(req.Description) {
			fields["description"] = "at most 140 printable characters"
		}
		if len(fields) > 0 {
			return invalid("invalid PIX request", fields)
		}

		r, err := ledger.Transfer(c.Request().Context(), pix.TransferRequest{
			From: from, ToKey: key, AmountCents: req.AmountCents, Description: req.Description, IdempotencyKey: idem,
		})
		if err != nil {
			return err
		}
		return c.JSON(http.StatusCreated, response{r.EndToEndID, r.AmountCents, r.BalanceCents,
			payee{r.ToKey, r.ToName}, r.CreatedAt})
	}
}

func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

func handleStatement(ledger pix.Ledger) echo.HandlerFunc {
	type entry struct {
		EndToEndID   string        `json:"end_to_end_id"`
		Direction    pix.Direction `json:"direction"`
		AmountCents  int64         `json:"amount_cents"`
		Counterparty string        `json:"counterparty"`
		Description  string        `json:"description"`
		CreatedAt    time.Time     `json:"created_at"`
	}
	type response struct {
		AccountID    string  `json:"account_id"`
		BalanceCents int64   `json:"balance_cents"`
		Entries      []entry `json:"entries"`
	}
	return func(c echo.Context) error {
		id, err := auth.AccountID(c)
		if err != nil {
			return err
		}
		limit := 50
		if s, ok := c.QueryParams()["limit"]; ok {
			n, err := strconv.Atoi(s[0])
			if err != nil || n < 1 || n > 100 || len(s) > 1 {
				return invalid("invalid query", map[string]string{"limit": "must be an integer from 1 to 100"})
			}
			limit = n
		}
		st, err := ledger.Statement(c.Request().Context(), id, limit)
		if err != nil {
			return err
		}
		resp := response{AccountID: st.AccountID, BalanceCents: st.BalanceCents, Entries: make([]entry, len(st.Entries))}
		for i, e := range st.Entries {
			resp.Entries[i] = entry{e.EndToEndID, e.Direction, e.AmountCents, e.Counterparty, e.Description, e.CreatedAt}
		}
		return c.JSON(http.StatusOK, resp)
	}
}
