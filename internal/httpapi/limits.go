package httpapi

import (
	"errors"

	"github.com/pixlimit/pixlimit/internal/ratelimit"
)

// Limit is a route's limit: the policy the limiter decides, and what the route does with a
// decision, or without one. The limiter knows requests and keys; fail modes and shadow mode are
// the route's.
type Limit struct {
	ratelimit.Policy
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
	// ⌈limit / replicas⌉ (ratelimit.Limiter.AllowFallback), with the same headers and refusals:
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

// check is one key of a request: a route's limit and the identity it counts.
type check struct {
	limit    Limit
	identity string
}

// checks makes the limiter's checks of cs.
func checks(cs []check) []ratelimit.Check {
	out := make([]ratelimit.Check, len(cs))
	for i, c := range cs {
		out[i] = ratelimit.Check{Policy: c.limit.Policy, Identity: c.identity}
	}
	return out
}

// validateTogether validates limits decided together, in one decision: their policies as
// ratelimit.ValidateTogether does, and one shadow mode for all, since one decision serves them.
func validateTogether(ls ...Limit) error {
	ps := make([]ratelimit.Policy, len(ls))
	for i, l := range ls {
		if l.Shadow != ls[0].Shadow {
			return &ratelimit.PolicyError{Policy: l.Name, Field: "Shadow", Reason: "limits decided together are all in shadow or none"}
		}
		ps[i] = l.Policy
	}
	return ratelimit.ValidateTogether(ps...)
}
