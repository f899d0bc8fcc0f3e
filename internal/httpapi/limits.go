package httpapi

import (
	"fmt"

	"github.com/pixlimit/pixlimit/internal/enforce"
	"github.com/pixlimit/pixlimit/internal/ratelimit"
)

// check is one key of a request: what the limiter decides (the route's policy and the identity
// it counts) and what the route does with its decision, or without one.
type check struct {
	ratelimit.Check
	failMode enforce.FailMode // what the route does when the limiter cannot decide
	shadow   bool             // a refusal is served as if admitted (enforce.RouteLimit.Shadow)
}

// checkOf is limit's check of identity.
func checkOf(limit enforce.RouteLimit, identity string) check {
	return check{ratelimit.Check{Policy: limit.Policy, Identity: identity}, limit.FailMode, limit.Shadow}
}

// checks are the limiter's checks of cs.
func checks(cs []check) []ratelimit.Check {
	out := make([]ratelimit.Check, len(cs))
	for i, c := range cs {
		out[i] = c.Check
	}
	return out
}

// layersFor refuses limits that need a layer the server lacks: a queue's (leaky_bucket) needs a
// Queue to hold its admissions until their turns, a local fail mode a Fallback.
func layersFor(queue, fallback bool, ls ...enforce.RouteLimit) error {
	for _, l := range ls {
		switch {
		case l.Policy.Algorithm == ratelimit.LeakyBucket && !queue:
			return fmt.Errorf("httpapi: %s is a queue (leaky_bucket): Deps needs a Queue", l.Policy.Name)
		case l.FailMode == enforce.FailFallback && !fallback:
			return fmt.Errorf("httpapi: %s fails local: Deps needs a Fallback", l.Policy.Name)
		}
	}
	return nil
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
