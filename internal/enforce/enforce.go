// Package enforce holds what the API does with the limiter: each route's limit (the policy the
// limiter decides, its fail mode and shadow mode) and the set of them a replica runs with. The
// configuration builds them from the environment and the HTTP layer applies them; neither needs
// the other to know them, and the limiter knows none of it.
package enforce

import (
	"errors"
	"net/netip"
	"time"

	"github.com/pixlimit/pixlimit/internal/ratelimit"
)

// RouteLimit is a route's limit: the policy the limiter decides, and what the route does with a
// decision, or without one. The limiter knows requests and keys; fail modes and shadow mode are
// the route's.
type RouteLimit struct {
	// Policy is what the limiter decides: its name, algorithm, limit, window and burst.
	Policy ratelimit.Policy
	// FailMode is what the route does when the limiter cannot decide; the zero value is
	// FailClosed.
	FailMode FailMode
	// Shadow serves a refusal as if admitted, counting it (shadow_refused): how a new limit is
	// watched before it is enforced. The limiter decides as usual, and records nothing for a
	// refusal either way, so what it counts is what enforcing would have done.
	Shadow bool
}

// FailMode says what a route does with a request that the limiter could not decide in time.
type FailMode int

const (
	// FailClosed refuses the request (429 rate_limiter_unavailable): the safe choice where an
	// unlimited route is a risk (login, money). It is the zero value, so a route fails closed
	// unless it says otherwise.
	FailClosed FailMode = iota
	// FailOpen serves the request unlimited, without RateLimit headers: the choice where
	// unavailability costs more than abuse.
	FailOpen
	// FailFallback decides the request in the replica's memory at its share of the limit,
	// ⌈limit / replicas⌉ (package fallback), with the same headers and refusals:
	// the route stays available and bounded (the statement's default). Its FAIL_MODE value is
	// "local", the contract's word since wave 1.
	FailFallback
)

func (m FailMode) String() string {
	switch m {
	case FailOpen:
		return "open"
	case FailFallback:
		return "local"
	}
	return "closed"
}

// UnmarshalText parses "open", "closed" or "local".
func (m *FailMode) UnmarshalText(text []byte) error {
	switch string(text) {
	case "closed":
		*m = FailClosed
	case "open":
		*m = FailOpen
	case "local":
		*m = FailFallback
	default:
		return errors.New("want open, closed or local")
	}
	return nil
}

// RouteLimits are the routes' limits.
type RouteLimits struct {
	PIX, Statement, LoginIP, LoginAccount RouteLimit
	// LoginDevice limits the logins of one trusted device, in place of LoginAccount.
	LoginDevice RouteLimit
	// LoginNet limits the logins of an IPv6 client's /48 (NetIdentity), beside its /64's
	// LoginIP: one site cannot fill Redis with keys of its 65,536 /64s.
	LoginNet RouteLimit
	// Settings limits the account's settings routes (account-settings), per account and device:
	// one device's flood neither reaches the ledger nor keeps the owner's other devices out. A
	// lowering of a limit is never refused by it.
	Settings RouteLimit
	// FailClosedRetryAfter is the Retry-After when a fail-closed limit cannot be decided.
	FailClosedRetryAfter time.Duration
	// PIXLookup is the payer's DICT anti-scan token bucket for e-mail and phone keys
	// (pix-lookup) at a natural person's capacity, PIXLookupPJ the same at a company's; the
	// bucket of CPF, CNPJ and random keys (pix-lookup-v2) is the same policy under its own name.
	// A look-up that misses costs LookupMissCost tokens, one that finds the key 1, and a PIX
	// answered 201 gives one back.
	PIXLookup, PIXLookupPJ RouteLimit
	LookupMissCost         int
	// LookupParticipant is the bank's own bucket at DICT (pix-lookup-participant), shared by
	// every customer and replica: a hit costs 1, a miss LookupParticipantMissCost, a PIX
	// answered 201 gives one back. LookupCategory is the bank's DICT category (A to F), which
	// GET /v1/pix/keys/limits reports.
	LookupParticipant         RouteLimit
	LookupParticipantMissCost int
	LookupCategory            string
	// PIXConcurrency is the most PIX of one account in progress at once across the fleet
	// (pix-concurrency): its Policy's Limit is the slots (zero: no limit), its Window the lease
	// after which a slot whose replica died is free again.
	PIXConcurrency RouteLimit
	// MaxWait is the longest a queued request (a leaky_bucket route) may wait for its turn: what
	// the write timeout leaves beside the longest request.
	MaxWait time.Duration
	// Budget is one limiter decision's (REDIS_TIMEOUT): a queued request's wait is offered
	// within its deadline less it, for the call's way there and back.
	Budget time.Duration
}

// NetIdentity is the identity of addr's site: its /48 for an IPv6 address, as one site is
// usually given (it holds 65,536 /64s, each a ratelimit.IPIdentity); ok is false for IPv4 (one
// carried in IPv6 too: ratelimit.Unmap), whose address is the client's. Counting a site's requests too keeps one site from minting keys
// without end.
func NetIdentity(addr netip.Addr) (identity string, ok bool) {
	addr = ratelimit.Unmap(addr)
	if addr.Is4() {
		return "", false
	}
	p, _ := addr.WithZone("").Prefix(48)
	return p.String(), true
}
