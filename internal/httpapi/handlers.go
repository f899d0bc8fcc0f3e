package httpapi

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"net/url"
	"regexp"
	"strconv"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/labstack/echo/v4"

	"github.com/pixlimit/pixlimit/internal/auth"
	"github.com/pixlimit/pixlimit/internal/enforce"
	"github.com/pixlimit/pixlimit/internal/pix"
	"github.com/pixlimit/pixlimit/internal/ratelimit"
)

func handleHealthz() echo.HandlerFunc {
	return func(c echo.Context) error {
		return c.JSON(http.StatusOK, map[string]string{"status": "ok"})
	}
}

// handleOpenAPI serves the contract as docs/openapi.yaml holds it: no auth, cacheable (an ETag of
// its hash, so a client revalidates for nothing).
func handleOpenAPI(doc []byte) echo.HandlerFunc {
	sum := sha256.Sum256(doc)
	etag := `"` + hex.EncodeToString(sum[:8]) + `"`
	return func(c echo.Context) error {
		h := c.Response().Header()
		h.Set("ETag", etag)
		h.Set("Cache-Control", "public, max-age=3600")
		if c.Request().Header.Get("If-None-Match") == etag {
			return c.NoContent(http.StatusNotModified)
		}
		return c.Blob(http.StatusOK, "application/yaml", doc)
	}
}

// handleReadyz reports whether this replica can do its job: each probe answers within its
// timeout. The Redis probe is a decision's own needs (a script that writes: ratelimit.Probe,
// through the breaker's Ready when there is one), not a PING, which a read-only or full Redis still answers while
// every decision fails. The probes run together, so a round takes the slowest probe's timeout
// at most, not their sum: a proxy routing on /readyz gives its check a deadline. An open breaker
// is named in the body ("breaker": "open"). A probe that changes state is logged once, with the
// cause of its failure: /readyz is asked every second, and a line each would bury the one that
// says why a replica left the rotation.
//
// Anyone may ask /readyz, and a round of probes holds a Redis connection and a database one:
// a flood of it would take the connections customers' requests need. So one round runs at a
// time, readyGap at least after the last one ended, and a request is answered by the first
// round that starts after it came, which every request that came meanwhile shares: never an
// answer older than the request, one connection of each pool at most, and ten rounds a second
// at most, however often /readyz is asked (a proxy asks once a second).
func handleReadyz(probes []Probe, brk Breaker, logger *slog.Logger) echo.HandlerFunc {
	r := &readiness{probes: probes, logger: logger, turn: make(chan struct{}, 1), down: make([]bool, len(probes))}
	return func(c echo.Context) error {
		body, status, err := r.answer(c.Request().Context())
		if err != nil {
			return err // the client left
		}
		if brk != nil && brk.Open() {
			body["breaker"], body["status"], status = "open", "degraded", http.StatusServiceUnavailable
		}
		return c.JSON(status, body)
	}
}

// readyGap is the least time between two rounds of /readyz's probes.
const readyGap = 100 * time.Millisecond

// readiness runs /readyz's rounds of probes, one at a time.
type readiness struct {
	probes []Probe
	logger *slog.Logger
	turn   chan struct{} // held by the round under way
	down   []bool        // each probe's state as last logged; the round under way's
	ended  time.Time     // when the last round ended; the round under way's

	mu   sync.Mutex
	next *round // the round that starts when the one under way ends; nil: none yet
}

// round is one run of the probes: failed holds their failures once done is closed.
type round struct {
	done   chan struct{}
	failed []error
}

// answer is the body and status of the first round to start after it was asked. The request
// that makes a round runs it, on a context its client cannot cancel (others share the round);
// each probe has its timeout, so a request waits at most two rounds of them and a gap.
func (r *readiness) answer(ctx context.Context) (map[string]string, int, error) {
	r.mu.Lock()
	rd, mine := r.next, r.next == nil
	if mine {
		rd = &round{done: make(chan struct{})}
		r.next = rd
	}
	r.mu.Unlock()
	if mine {
		r.run(context.WithoutCancel(ctx), rd)
	}
	select {
	case <-rd.done:
	case <-ctx.Done():
		return nil, 0, ctx.Err()
	}
	body := map[string]string{"status": "ready"}
	status := http.StatusOK
	for i, p := range r.probes {
		body[p.Name] = "up"
		if rd.failed[i] != nil {
			body[p.Name], body["status"], status = "down", "degraded", http.StatusServiceUnavailable
		}
	}
	return body, status, nil
}

// run runs rd once the round under way has ended, and readyGap after it: the probes together,
// each within its timeout; then it logs each probe that changed state. The requests that come
// meanwhile share rd.
func (r *readiness) run(ctx context.Context, rd *round) {
	r.turn <- struct{}{}
	defer func() { <-r.turn }()
	if gap := readyGap - time.Since(r.ended); gap > 0 {
		time.Sleep(gap)
	}
	r.mu.Lock()
	r.next = nil // it starts: a request that comes now waits for the next
	r.mu.Unlock()
	failed := make([]error, len(r.probes))
	var wg sync.WaitGroup
	for i, p := range r.probes {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(ctx, p.Timeout)
			defer cancel()
			failed[i] = p.Ping(ctx)
		})
	}
	wg.Wait()
	for i, p := range r.probes {
		switch was := r.down[i]; {
		case failed[i] != nil && !was:
			r.logger.Warn("readiness: a dependency is down", "probe", p.Name, "cause", failed[i].Error())
		case failed[i] == nil && was:
			r.logger.Info("readiness: a dependency is up again", "probe", p.Name)
		}
		r.down[i] = failed[i] != nil
	}
	rd.failed, r.ended = failed, time.Now()
	close(rd.done)
}

// loginLedger is what a login needs of the ledger: the accounts, and its clock.
type loginLedger interface {
	auth.AccountFinder
	pix.Clock
}

// deviceCookie carries a browser's device token: __Host- pins it to this host, over HTTPS, on
// every path; HttpOnly keeps scripts away from it; SameSite=Strict keeps other sites from
// sending it.
const deviceCookie = "__Host-pixlimit-device"

// handleLogin checks the client IP (an IPv6 client's /64, and its /48 too) and, when the document
// is a valid CPF or CNPJ, the document too, in one limiter decision made before anything else: a refused login costs no bcrypt and reveals
// nothing, and every attempt counts, malformed ones included. A login that presents a valid
// device token for its document (auth.Devices) is counted against that device's key instead of
// the document's: a botnet filling a customer's document key does not lock her out on a device
// she used before. Any other token (expired, forged, for another document, malformed) counts as
// none, and the answer does not say why.
func handleLogin(limiter limiter, limits enforce.RouteLimits, accounts loginLedger, passwords *auth.Passwords, tokens *auth.Tokens, devices *auth.Devices, tiers *pix.Tiers) echo.HandlerFunc {
	type request struct {
		Document string `json:"document"`
		Password string `json:"password"`
	}
	type response struct {
		AccessToken string `json:"access_token"`
		TokenType   string `json:"token_type"`
		ExpiresIn   int64  `json:"expires_in"`
		AccountID   string `json:"account_id"`
		DeviceToken string `json:"device_token"`
	}
	reports := [2]*report{loginReport(limits, false), loginReport(limits, true)} // made once, not per login
	return func(c echo.Context) error {
		var req request
		decodeErr := decodeJSON(c, &req)
		if decodeErr != nil && c.Request().Context().Err() != nil {
			// Its body's read failed and ended the request's context (a body past bodyWithin, or
			// a client gone): every login counts against its IP key all the same.
			c.SetRequest(c.Request().WithContext(context.WithoutCancel(c.Request().Context())))
		}
		addr, err := clientIP(c)
		if err != nil {
			return err
		}
		document, person, docErr := pix.ParseDocument(req.Document)
		device := ""
		if decodeErr == nil && docErr == nil {
			device, _ = devices.Verify(presentedDevice(c), document, deviceRevokedSince(tiers, document))
		}
		var keys [3]check // on the stack: a refused login allocates as little as a 429 can
		checks, netSkipped := loginChecks(keys[:0], limits, addr, device, document, decodeErr == nil && docErr == nil)
		admitted, err := limiter.enforced(c, reports[netSkipped], checks...)
		if err != nil {
			return err
		}
		if decodeErr != nil {
			return decodeErr
		}

		if err := validLogin(docErr, req.Password); err != nil {
			return err
		}
		payer := tokens.PayerID(document) // her look-up takes a place of her share of the ledger, as her account's calls do
		ctx := pix.ForCustomer(c.Request().Context(), payer)
		acct, err := passwords.Check(ctx, accounts, document, req.Password, laneOf(device))
		if errors.Is(err, auth.ErrBusy) || errors.Is(err, pix.ErrLedgerBusy) {
			// Shed before its password was compared: decided by nothing, it spends none of its
			// keys' quota (or a flood would spend a customer's five tries for her, 503 by 503).
			limiter.takeBack(c, admitted, "login", checks...)
		}
		if err != nil {
			return err
		}
		if device == "" {
			device = rand.Text() // a new device: the access token and the device token name it
		}
		// Stamped by the ledger's clock, after the password was checked: a revocation (stamped by
		// the same clock) refuses the tokens issued before it and honours this one if it came after.
		at, err := accounts.Now(c.Request().Context())
		if err != nil {
			return err
		}
		token, err := tokens.Issue(auth.Subject{Account: acct.ID, Payer: payer, Person: string(person), Device: device, IssuedAt: at})
		if err != nil {
			return err
		}
		deviceToken, err := devices.Issue(document, device, at) // a known device keeps its id
		if err != nil {
			return err
		}
		c.SetCookie(&http.Cookie{Name: deviceCookie, Value: deviceToken, Path: "/", MaxAge: int(devices.TTL() / time.Second),
			Secure: true, HttpOnly: true, SameSite: http.SameSiteStrictMode})
		return c.JSON(http.StatusOK, response{token, "Bearer", int64(tokens.TTL() / time.Second), acct.ID, deviceToken})
	}
}

// loginChecks appends to checks the keys a login from addr decides: its client's IP; an IPv6
// client's /48, unless it presents a trusted device; and the device's key, or else the
// document's when its body named a valid one (withDocument). netSkipped is 1 when the /48 was
// left out for a trusted device (loginReport lists it all the same), else 0.
func loginChecks(checks []check, limits enforce.RouteLimits, addr netip.Addr, device, document string, withDocument bool) ([]check, int) {
	// A trusted device's login counts against neither the document nor the /48: a botnet
	// filling either (a site's flood included) does not lock her out on a device she used.
	checks = append(checks, checkOf(limits.LoginIP, ratelimit.IPIdentity(addr)))
	net, v6 := enforce.NetIdentity(addr) // IPv6: its /48 too
	if v6 && device == "" {
		checks = append(checks, checkOf(limits.LoginNet, net))
	}
	switch {
	case device != "":
		checks = append(checks, checkOf(limits.LoginDevice, device))
	case withDocument:
		checks = append(checks, checkOf(limits.LoginAccount, document))
	}
	netSkipped := 0
	if v6 && device != "" {
		netSkipped = 1
	}
	return checks, netSkipped
}

// loginReport is what a login's RateLimit headers say. Unless refused, the IP key only: the
// document key would tell anyone how many attempts were made on someone else's CPF, and when. A
// refusal reports every key decided, but a trusted device's key under the document key's policy
// (login-account, its limit and window), and, when the /48 was not decided for a trusted device
// (netSkipped), login-net listed where it would be: otherwise a refusal, which costs nothing,
// would say whether a device token is valid for a CPF, and a stolen token would find its owner.
func loginReport(limits enforce.RouteLimits, netSkipped bool) *report {
	asAccount := func(r ratelimit.Result) ratelimit.Result {
		if r.Policy.Name == limits.LoginDevice.Policy.Name {
			r.Policy, r.Capacity = limits.LoginAccount.Policy, limits.LoginAccount.Policy.Capacity()
			r.Remaining = min(r.Remaining, r.Capacity)
		}
		return r
	}
	return &report{show: func(d ratelimit.Decision) ratelimit.Decision {
		if d.Allowed {
			return first(d)
		}
		results := make([]ratelimit.Result, 0, len(d.Results)+1)
		for i, r := range d.Results {
			if i == 1 && netSkipped { // after the IP, as decided for any other login
				p := limits.LoginNet.Policy
				results = append(results, ratelimit.Result{Policy: p, Capacity: p.Capacity(), Remaining: p.Capacity()})
			}
			results = append(results, asAccount(r))
		}
		d.Results, d.Worst = results, asAccount(d.Worst)
		return d
	}}
}

// laneOf is a login's lane for its turn at a password comparison (auth.Passwords): before a
// flood's with a device token of its own document, not revoked (device, as Devices.Verify read
// it); a botnet's token of its own account gives its logins of other documents no such turn.
func laneOf(device string) auth.From {
	if device != "" {
		return auth.Trusted
	}
	return auth.Anyone
}

// validLogin names the login's invalid fields, if any.
func validLogin(docErr error, password string) error {
	fields := map[string]string{}
	if docErr != nil {
		fields["document"] = "must be a valid CPF (529.982.247-25) or CNPJ (11.222.333/0001-81, or alphanumeric: 12.ABC.345/01DE-35), punctuation optional"
	}
	switch {
	case password == "":
		fields["password"] = "required"
	case len(password) > 72:
		fields["password"] = "at most 72 bytes" // bcrypt's limit
	}
	if len(fields) > 0 {
		return invalid("invalid login request", fields)
	}
	return nil
}

// presentedDevice is the device token a login presents: the Device-Token header, else the
// cookie. Two headers, or two cookies, are ambiguous (a proxy may read one, the API another): no
// device's.
func presentedDevice(c echo.Context) string {
	switch vs := c.Request().Header.Values("Device-Token"); {
	case len(vs) > 1:
		return ""
	case len(vs) == 1 && vs[0] != "":
		return vs[0]
	}
	if cks := c.Request().CookiesNamed(deviceCookie); len(cks) == 1 {
		return cks[0].Value
	}
	return ""
}

var idempotencyKey = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

const maxDescription = 140

// handlePIX sends a PIX. It reads in the order it happens: the access token names the payer
// (requireAccount, the route's one middleware); the body is decoded and validated, so a
// malformed PIX is a 400 that costs no quota; the look-up buckets are asked whether they could
// pay for a miss, the account's in-flight slots whether one is free, and then the PIX's own limit
// decides, per account (never per IP: a whole office shares one), at the account's tier, and the
// slot is taken (a queued PIX waits for its turn first, and takes its slot then); the ledger
// moves the money; and the look-up buckets are settled by the ledger's answer as the slot is
// given back (admission.go: admissions.admit, and ticket.settle).
func handlePIX(ledger pix.Payments, share *pix.Share, originals *originals, maxWait time.Duration, pixes admissions) echo.HandlerFunc {
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
		s, err := auth.SubjectOf(c)
		if err != nil {
			return err
		}
		req, err := decodePIX(c, s)
		if err != nil {
			return err
		}
		// A PIX's waits (its key's original, its place of the ledger, a queue's turn) end
		// together by maxWait: what the write timeout leaves after the longest PIX. Its wait for
		// its key's original, on this replica or another, ends by the longest transfer too.
		start := time.Now()
		waitUntil, originalUntil := start.Add(maxWait), start.Add(originals.wait)
		// One PIX of this key in progress on this replica: the others wait for its answer. One
		// whose client left meanwhile is decided by nothing: it spends no quota.
		defer originals.enter(c.Request().Context(), s.Account+"\x00"+req.IdempotencyKey, waitUntil)()
		if err := c.Request().Context().Err(); err != nil {
			return err
		}
		own := pixes.own(s)
		queued := own.Policy.Algorithm == ratelimit.LeakyBucket
		if share != nil && !queued {
			// One of the account's places of the ledger, held from before its admission: a PIX
			// answered ledger_busy was decided by nothing, so it spent no quota and holds no slot.
			// (A queued PIX takes its place at its turn, below: it would hold one through its
			// whole wait otherwise.) With every place taken, a PIX past its
			// account's in-flight slots is refused at once rather than after its wait.
			if share.Full(c.Request().Context(), s.Account) {
				if err := pixes.vacant(c, s, req.IdempotencyKey, own); err != nil {
					return err
				}
			}
			ctx, release, err := share.Hold(c.Request().Context(), s.Account, time.Until(waitUntil))
			if err != nil {
				return err
			}
			defer release()
			c.SetRequest(c.Request().WithContext(ctx))
		}
		admitted, err := pixes.admit(c, s, req, own, waitUntil, originalUntil) // admission.go
		if err != nil {
			return err
		}
		if share != nil && queued { // its turn has come: its place of the ledger, within its waits
			ctx, release, err := share.Hold(c.Request().Context(), s.Account, time.Until(waitUntil))
			if err != nil {
				return admitted.settle(pix.Receipt{}, err) // ledger_busy gives its turn back
			}
			defer release()
			c.SetRequest(c.Request().WithContext(ctx))
		}
		r, err := ledger.Transfer(c.Request().Context(), req.TransferRequest)
		if err := admitted.settle(r, err); err != nil {
			return err
		}
		return c.JSON(http.StatusCreated, response{r.EndToEndID, r.AmountCents, r.BalanceCents,
			payee{r.ToKey, r.ToName}, r.CreatedAt})
	}
}

// pixRequest is a PIX request once decoded and validated: the ledger's request, and the key's
// type, which chooses the look-up bucket.
type pixRequest struct {
	pix.TransferRequest
	keyType pix.KeyType
}

// decodePIX decodes and validates s's PIX request.
func decodePIX(c echo.Context, s auth.Subject) (pixRequest, error) {
	var req struct {
		Key         string `json:"key"`
		AmountCents int64  `json:"amount_cents"`
		Description string `json:"description"`
	}
	if err := decodeJSON(c, &req); err != nil {
		return pixRequest{}, err
	}
	key, keyType, idem, err := validTransfer(c.Request().Header, req.Key, req.AmountCents, req.Description)
	if err != nil {
		return pixRequest{}, err
	}
	return pixRequest{keyType: keyType, TransferRequest: pix.TransferRequest{From: s.Account, ToKey: key,
		AmountCents: req.AmountCents, Description: req.Description, IdempotencyKey: idem, Device: s.Device}}, nil
}

// validTransfer checks a PIX request and returns its normalized key and Idempotency-Key, or a
// 400: idempotency_key_required without the header (every PIX names itself, so that a retry after
// any failure is safe), else invalid_request naming every offending field.
func validTransfer(h http.Header, rawKey string, cents int64, description string) (key string, keyType pix.KeyType, idem string, err error) {
	fields := map[string]string{}
	idem = h.Get("Idempotency-Key")
	switch keys := h.Values("Idempotency-Key"); {
	case len(keys) == 0:
		return "", "", "", &Error{Code: CodeIdempotencyKeyRequired, Fields: map[string]string{"Idempotency-Key": "required"}}
	case len(keys) > 1:
		fields["Idempotency-Key"] = "must be sent once" // which one would the client mean?
	case !idempotencyKey.MatchString(idem):
		fields["Idempotency-Key"] = "must be 1-64 of A-Z a-z 0-9 _ -"
	}
	key, keyType, keyErr := pix.ParseKey(rawKey)
	if keyErr != nil {
		fields["key"] = keyErr.Error()
	}
	if cents <= 0 || cents > pix.MaxAmountCents {
		fields["amount_cents"] = fmt.Sprintf("must be a positive integer number of cents, at most %d (%s)",
			int64(pix.MaxAmountCents), pix.BRL(pix.MaxAmountCents))
	}
	if n := utf8.RuneCountInString(description); n > maxDescription || !printable(description) {
		fields["description"] = "at most 140 printable characters"
	}
	if len(fields) > 0 {
		return "", "", "", invalid("invalid PIX request", fields)
	}
	return key, keyType, idem, nil
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

// handleStatement shows the account's statement, newest first: the query is validated (a 400
// costs no quota); a read gives way to payments: while the ledger is busy (every connection in
// use, none idle) it is answered 503 ledger_busy at once, spending no quota, instead of queueing
// behind the transfers; then the statement limit decides per account at the account's tier (a
// queue's admission waits for its turn), and the ledger answers.
func handleStatement(ledger pix.Payments, decide limiter, limit enforce.RouteLimit, tiers *pix.Tiers) echo.HandlerFunc {
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
		s, err := auth.SubjectOf(c)
		if err != nil {
			return err
		}
		n, err := statementSize(c)
		if err != nil {
			return err
		}
		if ledger.Busy() {
			decide.metrics.shed(limit.Policy.Name)
			return &Error{Code: CodeLedgerBusy, RetryAfter: time.Second}
		}
		own := []check{checkOf(limitOf(tiers, decide.maxWait, limit, s, true), s.Account)}
		ctx, cancel := decide.throttle(c) // a queue's turn comes within it
		defer cancel()
		start := time.Now()
		d, err := decide.apply(c, nil, own, func(context.Context) (ratelimit.Decision, error) {
			return decide.decider().AllowAll(ctx, checks(own)...)
		})
		if err != nil {
			return err
		}
		if err := decide.wait(c, ctx, own, d, time.Since(start)); err != nil {
			return err
		}
		st, err := ledger.Statement(c.Request().Context(), s.Account, n)
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

// statementSize is the statement's ?limit=: 1 to 100 entries, 50 when absent. A query that does
// not parse is 400 too: Echo's QueryParams drops a pair it cannot read (?limit=1%zz, ?limit=1;),
// which would answer 50 entries for a limit the client did set.
func statementSize(c echo.Context) (int, error) {
	query, err := url.ParseQuery(c.Request().URL.RawQuery)
	if err != nil {
		return 0, invalid("invalid query", map[string]string{"query": "must be name=value pairs joined by &, percent-encoded"})
	}
	s, ok := query["limit"]
	if !ok {
		return 50, nil
	}
	n, err := strconv.Atoi(s[0])
	if err != nil || n < 1 || n > 100 || len(s) > 1 {
		return 0, invalid("invalid query", map[string]string{"limit": "must be an integer from 1 to 100"})
	}
	return n, nil
}
