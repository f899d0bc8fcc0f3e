package httpapi

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	mrand "math/rand/v2"
	"net/http"
	"net/netip"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/pixlimit/pixlimit/internal/auth"
	"github.com/pixlimit/pixlimit/internal/dict"
	"github.com/pixlimit/pixlimit/internal/enforce"
	"github.com/pixlimit/pixlimit/internal/pix"
	"github.com/pixlimit/pixlimit/internal/ratelimit"
	"github.com/pixlimit/pixlimit/internal/ratelimit/denycache"
)

// AdminDeps are what the support desk needs.
type AdminDeps struct {
	Logger  *slog.Logger
	Limiter *ratelimit.Limiter
	// Stack, when set, is what the desk's own limit (admin-ip) decides through, as the routes do
	// (Deps.Stack); DenyCache, when set, is the replica's deny cache: a key forgotten here leaves
	// it at once.
	Stack     ratelimit.Decider
	DenyCache *denycache.Cache
	Limits    enforce.RouteLimits
	// Ledger keeps the audit trail.
	Ledger pix.Ledger
	// Tokens names payers (auth.Tokens.PayerID) as the look-up buckets key them.
	Tokens *auth.Tokens
	// Token is ADMIN_TOKEN: the bearer token every call must carry.
	Token string
	// Tiers is the replica's tier table, refreshed at once after a change made here.
	Tiers *pix.Tiers
	// AuditKey keys the hash that names an account or a caller's IP in the audit
	// (auth.DeriveKey(AUTH_SECRET, "audit names")): guessable ids are not reversible without it.
	AuditKey []byte
}

// adminIP limits the calls without the right token, per client IP: what a token guesser, or a
// flood, costs the desk (a refusal answered, counted and summarized, never an audit row each),
// not its chance: ADMIN_TOKEN's 32 random bytes or more are what no guesser finds. The right
// token is compared first and works from an IP past the limit, so a guesser behind the support
// team's own address (an office, a VPN) cannot lock the desk out.
var adminIP = enforce.RouteLimit{Policy: ratelimit.Policy{Name: "admin-ip", Limit: 10, Window: time.Minute}}

// deskTimeout bounds what one desk call does once the client can no longer cancel it: its audit
// records and its change.
const deskTimeout = 10 * time.Second

// NewAdmin returns the support desk's handler, for its own listener (ADMIN_ADDR), never the
// public one: a desk that sees a key's state by policy and identity and can clear it on every
// replica at once (denycache.Cache.Forget: Redis's key, and every replica's deny cache), so that
// a customer locked out by a botnet is let in now rather than when the window ends. Every call with the right token is audited in the ledger
// (who, what, which key by the limiter's own hash, when, the state before and after) and logged
// without any identity; a change is recorded before it is made and its outcome after. Calls
// without the right token are limited per IP (admin-ip) and audited as one summary per IP and
// minute.
//
//	GET    /admin/v1/keys/{policy}/{identity}  a key's state
//	DELETE /admin/v1/keys/{policy}/{identity}  clear it, on every replica
//	PUT    /admin/v1/accounts/{account_id}/tier  move an account to a tier, with overrides
//	GET    /admin/v1/tiers                      the tiers and the defaults under them
//	DELETE /admin/v1/accounts/{account_id}/devices  revoke every trusted device of the account
//
// The identity is what the policy counts: an account id (pix, statement), an IP (login-ip), a
// CPF or CNPJ (login-account; and pix-lookup, pix-lookup-v2, whose payer is named from it as the
// look-up does), a device id (login-device), or the bank's ISPB (pix-lookup-participant).
func NewAdmin(d AdminDeps) (*Admin, error) {
	if d.Logger == nil || d.Limiter == nil || d.Ledger == nil || d.Tokens == nil || d.Tiers == nil || len(d.Token) < 32 || len(d.AuditKey) < 16 {
		return nil, errors.New("httpapi: the support desk needs a Logger, a Limiter, a Ledger, Tokens, Tiers, a token of at least 32 bytes and an audit key")
	}
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.HTTPErrorHandler = errorHandler(d.Logger, time.Second)
	desk := &desk{AdminDeps: d, token: sha256.Sum256([]byte(d.Token)), refusals: newRefusals(d.Ledger, d.Logger),
		limiter: limiter{core: d.Limiter, stack: d.Stack, cache: d.DenyCache, failClosedRetryAfter: d.Limits.FailClosedRetryAfter}}
	e.Use(marked, desk.audit, limitBody) // the desk's answers hold key states and audit data: no cache keeps them
	e.GET("/admin/v1/keys/:policy/:identity", desk.getKey)
	e.DELETE("/admin/v1/keys/:policy/:identity", desk.deleteKey)
	e.PUT("/admin/v1/accounts/:account_id/tier", desk.putTier)
	e.GET("/admin/v1/tiers", desk.getTiers)
	e.DELETE("/admin/v1/accounts/:account_id/devices", desk.revokeDevices)
	e.POST("/admin/v1/accounts/:account_id/devices/:device_id/approve", desk.approveDevice)
	return &Admin{Handler: e, refusals: desk.refusals}, nil
}

// Admin is the support desk's handler. Close it after its listener has drained (before the
// ledger closes): it writes the summaries of refused calls that their minute has not ended yet.
type Admin struct {
	http.Handler
	refusals *refusals
}

// Close writes every summary still open; a refused call after it is written at once.
func (a *Admin) Close() { a.refusals.close() }

type desk struct {
	AdminDeps
	token    [32]byte // SHA-256 of ADMIN_TOKEN: compared in constant time, whatever the length sent
	limiter  limiter  // admin-ip
	refusals *refusals
}

// audited is what a call found out, for its audit record.
type audited struct {
	policy, key   string
	before, after string
}

// call is one desk call's audit: its record, kept by audit, and what the handler found out
// (audited, set by begin or noted), in the call's context under callKey, a type of its own.
type call struct {
	record  pix.AuditRecord
	audited audited
	begun   bool // its change's requested record stored: the change may be under way
}

type callKey struct{}

// callOf is c's call (audit set it); a zero one outside audit.
func callOf(c echo.Context) *call {
	if k, ok := c.Request().Context().Value(callKey{}).(*call); ok {
		return k
	}
	return &call{}
}

// note keeps what the call found out, for its audit record.
func note(c echo.Context, a audited) { callOf(c).audited = a }

// agentName is what a caller may call itself in Admin-Agent: the audit's "who" beside the
// token's fingerprint.
var agentName = regexp.MustCompile(`^[A-Za-z0-9._@-]{1,64}$`)

// audit authenticates every call (Authorization: Bearer ADMIN_TOKEN, compared in constant time)
// and records it. A call without the right token is counted against its IP (admin-ip) and in the
// IP's summary for the minute. A call with it runs on a context its client cannot cancel, for
// deskTimeout at most: a change is recorded as requested, naming what it changes, before it is
// made (begin: no record, no change), then made, then its outcome recorded, on a deadline of its
// own, so a client that resets its connection mid-call never leaves a change without its record.
// A read, or a call refused before any change, is recorded once, answered.
func (d *desk) audit(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		scheme, token, _ := strings.Cut(auth.Authorization(c.Request()), " ") // one header, or none
		sum := sha256.Sum256([]byte(strings.TrimSpace(token)))
		if !strings.EqualFold(scheme, "Bearer") || subtle.ConstantTimeCompare(sum[:], d.token[:]) != 1 {
			return d.refuse(c)
		}
		actor := "token:" + hex.EncodeToString(d.token[:4])
		agents := c.Request().Header.Values("Admin-Agent")
		badAgent := len(agents) > 1 || len(agents) == 1 && !agentName.MatchString(agents[0])
		if len(agents) == 1 && !badAgent {
			actor += " agent:" + agents[0]
		}
		k := &call{record: pix.AuditRecord{Actor: actor, Action: action(c), Request: rand.Text()[:16], Calls: 1}}
		ctx, cancel := context.WithTimeout(context.WithoutCancel(context.WithValue(c.Request().Context(), callKey{}, k)), deskTimeout)
		defer cancel()
		c.SetRequest(c.Request().WithContext(ctx))
		var read *heldResponse // a read is held until its record is stored: none is served unaudited
		if c.Request().Method == http.MethodGet {
			read = &heldResponse{to: c.Response().Writer, header: http.Header{}, status: http.StatusOK}
			c.Response().Writer = read
		}
		var err error // the call's, read by its audit record
		if badAgent { // refused, and recorded as any call refused before a change
			c.Error(invalid("invalid Admin-Agent", map[string]string{"Admin-Agent": "one header, 1 to 64 of A-Z a-z 0-9 . _ @ -"}))
		} else if err = recovering(next, c); err != nil { // a panic too: a 500 audited, as the public server logs one
			c.Error(err) // answered now, so the status audited is the one sent
		}
		rec, a := k.record, k.audited
		rec.At, rec.Status = time.Now().UTC(), c.Response().Status
		rec.Policy, rec.Key, rec.Before, rec.After = a.policy, a.key, a.before, a.after
		rec.Outcome = pix.OutcomeDone
		switch {
		case err != nil && toError(err, 0).Code == CodeChangeOutcomeUnknown, // sent, not confirmed: never "failed"
			rec.Status >= http.StatusInternalServerError && k.begun && toError(err, 0).Code == CodeInternal: // a bug once the change was under way
			rec.Outcome = pix.OutcomeUnknown
		case rec.Status >= 400:
			rec.Outcome = pix.OutcomeFailed
		}
		// Its own deadline: a slow change must not leave its outcome no time to be recorded.
		octx, ocancel := context.WithTimeout(context.WithoutCancel(ctx), deskTimeout)
		defer ocancel()
		err = d.Ledger.Audit(octx, rec)
		if err != nil {
			d.Logger.Error("support desk: audit record not stored", "action", rec.Action, "outcome", rec.Outcome, "status", rec.Status, "err", err)
		}
		if read != nil {
			c.SetResponse(echo.NewResponse(read.to, c.Echo()))
			if err != nil {
				c.Error(fmt.Errorf("%w: the read's audit record not stored, so it is not served: %w", pix.ErrUnavailable, err))
			} else {
				read.send(c.Response())
			}
		}
		d.Logger.Info("support desk", "actor", actor, "action", rec.Action, "policy", a.policy, "status", c.Response().Status)
		return nil
	}
}

// heldResponse holds a desk read's answer until its audit record is stored (desk.audit), then
// sends it on to the connection's writer, to.
type heldResponse struct {
	to     http.ResponseWriter
	header http.Header
	status int
	body   bytes.Buffer
}

func (h *heldResponse) Header() http.Header         { return h.header }
func (h *heldResponse) WriteHeader(status int)      { h.status = status }
func (h *heldResponse) Write(b []byte) (int, error) { return h.body.Write(b) }

// send writes the held answer to w.
func (h *heldResponse) send(w *echo.Response) {
	maps.Copy(w.Header(), h.header)
	w.WriteHeader(h.status)
	_, _ = w.Write(h.body.Bytes())
}

// begin records the change a is about to make (what it changes, its state before) as requested,
// under the call's request id: the change is made only once this record is stored.
func (d *desk) begin(c echo.Context, a audited) error {
	note(c, a)
	k := callOf(c)
	rec := k.record
	rec.At, rec.Outcome = time.Now().UTC(), pix.OutcomeRequested
	rec.Policy, rec.Key, rec.Before = a.policy, a.key, a.before
	if err := d.Ledger.Audit(c.Request().Context(), rec); err != nil {
		d.Logger.Error("support desk: the change's record not stored; the change is not made", "action", rec.Action, "err", err)
		return err
	}
	k.begun = true
	return nil
}

// refuse answers a call without the right token: 401, or 429 past admin-ip's limit for its IP,
// and counts it in the IP's summary for the minute.
func (d *desk) refuse(c echo.Context) error {
	ip := clientAddr(c.Request())
	err := d.limiter.enforce(c, nil, checkOf(adminIP, ratelimit.IPIdentity(ip)))
	if err == nil {
		err = auth.ErrUnauthorized
	}
	c.Error(err)
	d.refusals.count(d.name("ip", ratelimit.IPIdentity(ip)), action(c), c.Response().Status)
	return nil
}

// action names the call for the audit: its method and route template, never its parameters.
func action(c echo.Context) string {
	action := c.Request().Method + " " + c.Path()
	if c.Path() == "" || !strings.HasPrefix(c.Path(), "/admin/") {
		action = c.Request().Method + " unmatched"
	}
	if len(action) > 128 {
		action = action[:128]
	}
	return action
}

// clientAddr is the connection's peer: the desk's listener is internal, behind no proxy whose
// X-Forwarded-For it would trust.
func clientAddr(r *http.Request) netip.Addr {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.IPv6Unspecified()
	}
	return ap.Addr().Unmap()
}

// name is how the audit names an identity of a kind (account, ip): a keyed hash, which no one
// without AUTH_SECRET can reverse by hashing guessable ids.
func (d *desk) name(kind, id string) string {
	m := hmac.New(sha256.New, d.AuditKey)
	m.Write([]byte(kind + ":" + id))
	return kind + ":" + hex.EncodeToString(m.Sum(nil)[:16])
}

// refusals summarizes the calls without the right token: one audit record per IP and minute,
// written when the minute ends, saying how many calls it stands for. At most maxRefusalIPs IPs
// are summarized apart in a minute; the calls of any more are summarized together.
type refusals struct {
	ledger pix.AuditLog
	logger *slog.Logger
	every  time.Duration // a minute; shorter in tests
	mu     sync.Mutex
	open   map[string]*pix.AuditRecord // by IP name, for the current minute of each
	closed bool                        // the desk is closing: a summary is written at once
}

const maxRefusalIPs = 10_000

func newRefusals(ledger pix.AuditLog, logger *slog.Logger) *refusals {
	return &refusals{ledger: ledger, logger: logger, every: time.Minute, open: map[string]*pix.AuditRecord{}}
}

// count adds one refused call of ip (its audit name) to ip's summary of the minute; once the desk
// is closing, it writes the summary at once.
func (r *refusals) count(ip, action string, status int) {
	r.mu.Lock()
	if _, ok := r.open[ip]; !ok && len(r.open) >= maxRefusalIPs {
		ip = "ip:others"
	}
	rec, ok := r.open[ip]
	if !ok {
		now := time.Now().UTC()
		rec = &pix.AuditRecord{At: now, Actor: "unauthenticated", Action: action, Status: status, Key: ip, Outcome: pix.OutcomeRefused}
		r.open[ip] = rec
		if !r.closed {
			// Written after the period ends, spread over a tenth of one: thousands of IPs'
			// summaries do not reach the ledger at once.
			time.AfterFunc(now.Truncate(r.every).Add(r.every).Sub(now)+mrand.N(r.every/10), func() { r.flush(ip) })
		}
	}
	rec.Calls++
	rec.Status = max(rec.Status, status) // a 429 once the IP's limit is reached
	closed := r.closed
	r.mu.Unlock()
	if closed {
		r.flush(ip)
	}
}

// close writes every open summary now, within DeskCloseTimeout for them all (a flood's thousands
// of IPs must not hold a stopping replica past its grace): a replica that stops does not lose its
// last minute's. What is left when the time is up is logged, in one line, as not stored.
func (r *refusals) close() {
	r.mu.Lock()
	r.closed = true
	ips := slices.Collect(maps.Keys(r.open)) // their timers, when they fire, find them written
	r.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), DeskCloseTimeout)
	defer cancel()
	for i, ip := range ips {
		if ctx.Err() != nil {
			r.drop(ips[i:])
			return
		}
		r.flushWithin(ctx, ip)
	}
}

// drop gives up ips' summaries, logging how many calls they counted.
func (r *refusals) drop(ips []string) {
	r.mu.Lock()
	calls := 0
	for _, ip := range ips {
		if rec := r.open[ip]; rec != nil {
			calls += rec.Calls
			delete(r.open, ip)
		}
	}
	r.mu.Unlock()
	r.logger.Error("support desk: summaries of refused calls not stored: the desk closed", "ips", len(ips), "calls", calls)
}

// DeskCloseTimeout bounds the writing of a closing desk's open summaries (Admin.Close).
const DeskCloseTimeout = time.Second

// flush writes ip's summary of the minute.
func (r *refusals) flush(ip string) {
	ctx, cancel := context.WithTimeout(context.Background(), deskTimeout)
	defer cancel()
	r.flushWithin(ctx, ip)
}

// flushWithin is flush within ctx.
func (r *refusals) flushWithin(ctx context.Context, ip string) {
	r.mu.Lock()
	rec := r.open[ip]
	delete(r.open, ip)
	r.mu.Unlock()
	if rec == nil {
		return
	}
	if err := r.ledger.Audit(ctx, *rec); err != nil {
		r.logger.Error("support desk: summary of refused calls not stored", "calls", rec.Calls, "err", err)
	}
	r.logger.Warn("support desk: calls without the right token", "ip", ip, "calls", rec.Calls, "since", rec.At)
}

// keyState is a key's state as the desk shows it.
type keyState struct {
	Policy       string `json:"policy"`
	Key          string `json:"key"` // the Redis key: the limiter's keyed hash of the identity
	Limit        int    `json:"limit"`
	Remaining    int    `json:"remaining"`
	ResetSeconds int64  `json:"reset_seconds"`
	Full         bool   `json:"full"`
}

// keyParams are a key route's policy and identity, each decoded once: Echo's params are the
// escaped segments when the path needed escaping and decoded ones when it did not, so a CNPJ's
// slash sent as %2F (11.222.333%2F0001-81) reached resolve undecoded.
func keyParams(c echo.Context) (policy, identity string, err error) {
	rest := strings.TrimPrefix(c.Request().URL.EscapedPath(), "/admin/v1/keys/")
	p, id, _ := strings.Cut(rest, "/")
	if policy, err = url.PathUnescape(p); err == nil {
		identity, err = url.PathUnescape(id)
	}
	if err != nil {
		return "", "", invalid("invalid identity", map[string]string{"identity": "malformed percent-encoding"})
	}
	return policy, identity, nil
}

func (d *desk) getKey(c echo.Context) error {
	policy, identity, err := keyParams(c)
	if err != nil {
		return err
	}
	chk, err := d.resolve(c, policy, identity)
	if err != nil {
		return err
	}
	st, err := d.state(c, chk)
	if err != nil {
		return err
	}
	raw, _ := json.Marshal(st)
	note(c, audited{policy: st.Policy, key: st.Key, before: string(raw), after: string(raw)})
	return c.JSON(http.StatusOK, st)
}

func (d *desk) deleteKey(c echo.Context) error {
	policy, identity, err := keyParams(c)
	if err != nil {
		return err
	}
	chk, err := d.resolve(c, policy, identity)
	if err != nil {
		return err
	}
	before, err := d.state(c, chk)
	if err != nil {
		return err
	}
	a := audited{policy: before.Policy, key: before.Key}
	raw, _ := json.Marshal(before)
	a.before = string(raw)
	if err := d.begin(c, a); err != nil {
		return err
	}
	forget := d.Limiter.Forget
	if d.DenyCache != nil {
		forget = d.DenyCache.Forget // this replica's cache at once; the others' by the channel
	}
	switch err := forget(c.Request().Context(), chk); {
	case errors.Is(err, denycache.ErrNotAnnounced): // cleared: the other replicas' caches forget it within their hold
		d.Logger.Warn("support desk: key cleared, the other replicas not told; their deny caches forget it within the hold",
			"policy", before.Policy, "err", err)
	case err != nil && !ratelimit.MayHaveRun(err): // surely not sent, or refused by Redis: nothing changed
		return &Error{Code: CodeRateLimiterUnavailable, RetryAfter: time.Second, cause: err}
	case err != nil: // sent, and not answered in time: Redis may have cleared it
		return &Error{Code: CodeChangeOutcomeUnknown, RetryAfter: time.Second, cause: err}
	}
	// What Forget left: the key empty. Not read again: a read that failed now would answer the
	// change as failed, though it was made.
	after := keyState{Policy: before.Policy, Key: before.Key, Limit: before.Limit, Remaining: before.Limit}
	raw, _ = json.Marshal(after)
	a.after = string(raw)
	note(c, a)
	return c.JSON(http.StatusOK, map[string]keyState{"before": before, "after": after})
}

// state reads the key's state from Redis, taking nothing and changing nothing a route answers:
// an ask of the Limiter, beneath the deny cache, which it neither consults nor teaches. (It
// counts in the Limiter's Stats.Redis, and a failure in its RedisUp, as any call; made beside the stack, it is in no outage report.)
func (d *desk) state(c echo.Context, chk ratelimit.Check) (keyState, error) {
	ds, err := d.Limiter.Decide(c.Request().Context(), ratelimit.AskStep(chk))
	dec := ds.Last()
	if err != nil {
		return keyState{}, &Error{Code: CodeRateLimiterUnavailable, RetryAfter: time.Second, cause: err}
	}
	r := dec.Worst
	return keyState{Policy: chk.Policy.Name, Key: d.Limiter.Key(chk), Limit: r.Capacity, Remaining: r.Remaining,
		ResetSeconds: seconds(r.Reset), Full: !dec.Allowed}, nil
}

var (
	tierName  = regexp.MustCompile(`^[a-z][a-z0-9-]{0,31}$`) // the tiers table's own check (migration 006)
	accountID = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,63}$`)
	deviceID  = regexp.MustCompile(`^[A-Za-z0-9]{1,64}$`)
)

// resolve turns a policy's name and an identity, as a support agent knows it, into the check
// the route decides (the key hashed as it hashes it, under the limit of the account's tier), or
// a 404 for a policy the desk does not know, or an account the ledger does not, and a 400 for an
// identity that policy cannot count.
func (d *desk) resolve(c echo.Context, policy, identity string) (ratelimit.Check, error) {
	bad := func(want string) error {
		return invalid("invalid identity", map[string]string{"identity": "the " + policy + " policy counts " + want})
	}
	l := d.Limits
	switch policy {
	case l.PIX.Policy.Name, l.Statement.Policy.Name:
		if !accountID.MatchString(identity) {
			return ratelimit.Check{}, bad("an account id (acct-ana)")
		}
		return d.accountCheck(c, identity, policy == l.Statement.Policy.Name)
	case l.LoginIP.Policy.Name:
		addr, err := netip.ParseAddr(identity)
		if err != nil {
			return ratelimit.Check{}, bad("a client IP (203.0.113.7 or 2001:db8::1)")
		}
		return ratelimit.Check{Policy: l.LoginIP.Policy, Identity: ratelimit.IPIdentity(addr)}, nil
	case l.LoginNet.Policy.Name:
		addr, err := netip.ParseAddr(identity)
		net, ok := enforce.NetIdentity(addr)
		if err != nil || !ok {
			return ratelimit.Check{}, bad("an IPv6 client address (2001:db8::1): its /48")
		}
		return ratelimit.Check{Policy: l.LoginNet.Policy, Identity: net}, nil
	case l.Settings.Policy.Name:
		account, device, ok := strings.Cut(identity, "/")
		if !ok || !accountID.MatchString(account) || !deviceID.MatchString(device) {
			return ratelimit.Check{}, bad("an account id and a device id (acct-ana/DEVICEID)")
		}
		if _, err := d.account(c, account); err != nil {
			return ratelimit.Check{}, err
		}
		return ratelimit.Check{Policy: l.Settings.Policy, Identity: identity}, nil
	case adminIP.Policy.Name:
		addr, err := netip.ParseAddr(identity)
		if err != nil {
			return ratelimit.Check{}, bad("a client IP of the desk")
		}
		return ratelimit.Check{Policy: adminIP.Policy, Identity: ratelimit.IPIdentity(addr)}, nil
	case l.LoginAccount.Policy.Name:
		doc, _, err := pix.ParseDocument(identity)
		if err != nil {
			return ratelimit.Check{}, bad("a CPF or CNPJ")
		}
		return ratelimit.Check{Policy: l.LoginAccount.Policy, Identity: doc}, nil
	case l.LoginDevice.Policy.Name:
		if !deviceID.MatchString(identity) {
			return ratelimit.Check{}, bad("a device id")
		}
		return ratelimit.Check{Policy: l.LoginDevice.Policy, Identity: identity}, nil
	case l.PIXLookup.Policy.Name, l.PIXLookup.Policy.Name + "-v2":
		doc, person, err := pix.ParseDocument(identity)
		if err != nil {
			return ratelimit.Check{}, bad("the payer's CPF or CNPJ")
		}
		keyType := pix.KeyEmail
		if policy != l.PIXLookup.Policy.Name {
			keyType = pix.KeyCPF
		}
		return d.lookupCheck(c, doc, person, keyType)
	case l.LookupParticipant.Policy.Name:
		if identity != pix.ISPB && identity != dict.ParticipantIdentity {
			return ratelimit.Check{}, bad("the bank's ISPB (" + pix.ISPB + ")")
		}
		return ratelimit.Check{Policy: l.LookupParticipant.Policy, Identity: dict.ParticipantIdentity}, nil
	}
	return ratelimit.Check{}, &Error{Code: CodeNotFound, Message: "no such policy"}
}

// accountCheck is the key of an account's PIX limit (its statement's when statement), at its
// tier, as the route decides it.
func (d *desk) accountCheck(c echo.Context, id string, statement bool) (ratelimit.Check, error) {
	acct, err := d.account(c, id)
	if err != nil {
		return ratelimit.Check{}, err
	}
	_, person, _ := pix.ParseDocument(acct.Document)
	limit := d.Limits.PIX
	if statement {
		limit = d.Limits.Statement
	}
	limit = limitOf(d.Tiers, d.Limits.MaxWait, limit, auth.Subject{Account: acct.ID, Person: string(person)}, statement)
	return ratelimit.Check{Policy: limit.Policy, Identity: id}, nil
}

// account is the ledger's account id, or a 404 when it has none.
func (d *desk) account(c echo.Context, id string) (pix.Account, error) {
	acct, err := d.Ledger.Account(c.Request().Context(), id)
	if errors.Is(err, pix.ErrAccountNotFound) {
		return pix.Account{}, &Error{Code: CodeNotFound, Message: "no such account"}
	}
	return acct, err
}

// lookupCheck is the key of a payer's look-up bucket for keys of keyType, at its account's tier
// when the document has an account.
func (d *desk) lookupCheck(c echo.Context, doc string, person pix.Person, keyType pix.KeyType) (ratelimit.Check, error) {
	payer := auth.Subject{Payer: d.Tokens.PayerID(doc), Person: string(person)}
	switch acct, err := d.Ledger.AccountByDocument(c.Request().Context(), doc); {
	case err == nil:
		payer.Account = acct.ID // its tier may give its buckets another capacity
	case !errors.Is(err, pix.ErrAccountNotFound):
		return ratelimit.Check{}, err
	}
	chk := newBuckets(limiter{}, d.Limits, d.Tiers).bucket(payer, keyType)
	return chk.Check, nil
}

// tierBody is a tier or an account's assignment as the desk shows and takes it: 0 is the
// default (an override of 0 is none).
type tierBody struct {
	Name           string `json:"name,omitempty"`
	Tier           string `json:"tier,omitempty"`
	PIXLimit       int    `json:"pix_limit"`
	StatementLimit int    `json:"statement_limit"`
	LookupCapacity int    `json:"lookup_capacity"`
}

func (d *desk) getTiers(c echo.Context) error {
	type defaults struct {
		PIXLimit         int `json:"pix_limit"`
		StatementLimit   int `json:"statement_limit"`
		LookupCapacityPF int `json:"lookup_capacity_pf"`
		LookupCapacityPJ int `json:"lookup_capacity_pj"`
	}
	table := d.Tiers.Table()
	// A tier as shown: its figures, and its PIX queue (0: the route's own algorithm).
	type tierView struct {
		tierBody
		PIXQueue int `json:"pix_queue"`
	}
	out := struct {
		Version  int64      `json:"version"`
		Tiers    []tierView `json:"tiers"`
		Defaults defaults   `json:"defaults"`
	}{Version: table.Version, Tiers: []tierView{}, Defaults: defaults{d.Limits.PIX.Policy.Limit, d.Limits.Statement.Policy.Limit,
		d.Limits.PIXLookup.Policy.Burst, d.Limits.PIXLookupPJ.Policy.Burst}}
	for _, t := range table.SortedTiers() {
		out.Tiers = append(out.Tiers, tierView{tierBody{Name: t.Name, PIXLimit: t.PIXLimit, StatementLimit: t.StatementLimit,
			LookupCapacity: t.LookupCapacity}, t.PIXQueue})
	}
	return c.JSON(http.StatusOK, out)
}

// putTier moves an account to a tier, with its own overrides, and refreshes this replica's
// table at once; the others read it within their polling interval.
func (d *desk) putTier(c echo.Context) error {
	id := c.Param("account_id")
	if !accountID.MatchString(id) {
		return invalid("invalid account id", map[string]string{"account_id": "an account id (acct-ana)"})
	}
	var req tierBody
	if err := decodeJSON(c, &req); err != nil {
		return err
	}
	if req.Name != "" || !tierName.MatchString(req.Tier) { // a name no tier can have never reaches the ledger
		return invalid("invalid tier", map[string]string{"tier": "required: one of GET /admin/v1/tiers"})
	}
	before, _ := json.Marshal(d.Tiers.Table().Accounts[id])
	a := audited{policy: "tier", key: d.name("account", id), before: string(before)}
	if err := d.begin(c, a); err != nil {
		return err
	}
	set := pix.TierOf{Tier: req.Tier, PIXLimit: req.PIXLimit, StatementLimit: req.StatementLimit, LookupCapacity: req.LookupCapacity}
	err := d.Ledger.SetTier(c.Request().Context(), id, set)
	switch {
	case errors.Is(err, pix.ErrUnknownTier):
		return invalid("invalid tier", map[string]string{"tier": "no such tier: see GET /admin/v1/tiers"})
	case errors.Is(err, pix.ErrInvalidLimits):
		return invalid("invalid overrides", map[string]string{"overrides": err.Error()})
	case errors.Is(err, pix.ErrAccountNotFound):
		return &Error{Code: CodeNotFound, Message: "no such account"}
	case err != nil:
		return err
	}
	if err := d.Tiers.Refresh(c.Request().Context()); err != nil {
		d.Logger.Warn("support desk: tier table not refreshed after a change; the poller will", "err", err)
	}
	after, _ := json.Marshal(set) // what the ledger stored: this replica's table may not have read it yet
	a.after = string(after)
	note(c, a)
	return c.JSON(http.StatusOK, tierBody{Tier: req.Tier, PIXLimit: req.PIXLimit, StatementLimit: req.StatementLimit, LookupCapacity: req.LookupCapacity})
}

// revokeDevices revokes every trusted device of an account, support's answer to a stolen phone
// (pix.Ledger.RevokeDevices): the access tokens issued until now are refused (401), the device
// tokens of its holder's document no longer count a login against a device's own key, and its
// devices registered for PIX send under the new-device caps again. This replica's table is
// refreshed at once; the others' within their polling interval (until then they honour the old
// tokens). All of them, not one chosen device: a thief's device is the one whose id the
// customer does not know.
func (d *desk) revokeDevices(c echo.Context) error {
	id := c.Param("account_id")
	if !accountID.MatchString(id) {
		return invalid("invalid account id", map[string]string{"account_id": "an account id (acct-ana)"})
	}
	a := audited{policy: "devices", key: d.name("account", id)}
	if err := d.begin(c, a); err != nil {
		return err
	}
	r, err := d.Ledger.RevokeDevices(c.Request().Context(), id)
	switch {
	case errors.Is(err, pix.ErrAccountNotFound):
		return &Error{Code: CodeNotFound, Message: "no such account"}
	case err != nil:
		return err
	}
	type revocation struct {
		RevokedAt    *time.Time `json:"revoked_at"`
		Unregistered int        `json:"unregistered_devices,omitempty"`
	}
	var before *time.Time
	if !r.Before.IsZero() {
		before = &r.Before
	}
	b, _ := json.Marshal(revocation{RevokedAt: before})
	after, _ := json.Marshal(revocation{RevokedAt: &r.At, Unregistered: r.Unregistered})
	a.before, a.after = string(b), string(after)
	note(c, a)
	if err := d.Tiers.Refresh(c.Request().Context()); err != nil {
		d.Logger.Warn("support desk: table not refreshed after a revocation; the poller will", "err", err)
	}
	return c.JSON(http.StatusOK, map[string]any{"account_id": id, "revoked_at": r.At, "unregistered_devices": r.Unregistered})
}

// approveDevice registers an account's pending device at once (pix.Ledger.DeskApproveDevice):
// after a revocation the account has no registered device to approve its owner's new phone, and
// only the desk, having checked who calls, can spare her DEVICE_REGISTRATION_DELAY. 404 when the
// account does not exist or the device never asked to register.
func (d *desk) approveDevice(c echo.Context) error {
	id, device := c.Param("account_id"), c.Param("device_id")
	fields := map[string]string{}
	if !accountID.MatchString(id) {
		fields["account_id"] = "an account id (acct-ana)"
	}
	if !deviceID.MatchString(device) {
		fields["device_id"] = "1 to 64 letters and digits"
	}
	if len(fields) > 0 {
		return invalid("invalid device", fields)
	}
	// The device's state before, as the ledger has it (the audit must not say a device was not
	// registered when it was: approving one again changes nothing).
	list, err := d.Ledger.Devices(c.Request().Context(), id)
	if err != nil && !errors.Is(err, pix.ErrAccountNotFound) {
		return err
	}
	before := `{"requested":false}`
	for _, r := range list {
		if r.DeviceID == device {
			before = fmt.Sprintf(`{"registered":%t,"device":"%s"}`, r.Registered, d.name("device", device))
		}
	}
	a := audited{policy: "devices", key: d.name("account", id), before: before}
	if err := d.begin(c, a); err != nil {
		return err
	}
	switch err := d.Ledger.DeskApproveDevice(c.Request().Context(), id, device); {
	case errors.Is(err, pix.ErrAccountNotFound):
		return &Error{Code: CodeNotFound, Message: "no such account"}
	case errors.Is(err, pix.ErrDeviceNotFound):
		return &Error{Code: CodeNotFound, Message: "no such device: it never asked to register"}
	case err != nil:
		return err
	}
	a.after = `{"registered":true,"device":"` + d.name("device", device) + `"}`
	note(c, a)
	return c.JSON(http.StatusOK, map[string]any{"account_id": id, "device_id": device, "registered": true})
}
