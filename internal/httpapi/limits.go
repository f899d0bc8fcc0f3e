package httpapi

import (
	"github.com/pixlimit/pixlimit/internal/enforce"
	"github.com/pixlimit/pixlimit/internal/ratelimit"
)

// check is one key of a request: a route's limit and the identity it counts.
type check struct {
	limit    enforce.RouteLimit
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
func validateTogether(ls ...enforce.RouteLimit) error {
	ps := make([]ratelimit.Policy, len(ls))
	for i, l := range ls {
		if l.Shadow != ls[0].Shadow {
			return &ratelimit.PolicyError{Policy: l.Policy.Name, Field: "Shadow", Reason: "limits decided together are all in shadow or none"}
		}
		ps[i] = l.Policy
	}
	return ratelimit.ValidateTogether(ps...)
}
