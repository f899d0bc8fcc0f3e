package httpapi

import (
	"time"

	"github.com/pixlimit/pixlimit/internal/auth"
	"github.com/pixlimit/pixlimit/internal/enforce"
	"github.com/pixlimit/pixlimit/internal/pix"
	"github.com/pixlimit/pixlimit/internal/ratelimit"
)

// The tier table as the routes read it (pix.Tiers keeps this replica's copy current): an
// account's limits and queue, and the revocations a token or a device is checked against.

// revocations are the accounts' revocations in force on this replica, for auth.RequireAccount;
// nil without Tiers.
func revocations(t *pix.Tiers) auth.Revocations {
	if t == nil {
		return nil
	}
	return t
}

// deviceRevokedSince is, for each device, when support last revoked the devices of one of
// document's accounts or the owner removed that device: a login's device token issued before
// it is no device.
func deviceRevokedSince(t *pix.Tiers, document string) func(device string) time.Time {
	return func(device string) time.Time {
		if t == nil {
			return time.Time{}
		}
		return t.Table().DeviceRevokedSince(document, device)
	}
}

// figures are s's account's tier with its overrides (a zero limit or capacity: the default; a
// zero PIXQueue: none), or all defaults without Tiers.
func figures(t *pix.Tiers, s auth.Subject) pix.Tier {
	if t == nil {
		return pix.Tier{}
	}
	return t.Table().Figures(s.Account, pix.Person(s.Person))
}

// own is s's PIX limit: its account's tier's (limitOf).
func (pa admissions) own(s auth.Subject) check {
	return checkOf(limitOf(pa.tiers, pa.maxWait, pa.limit, s, false), s.Account)
}

// limitOf is l, the PIX route's limit (the statement's when statement), as s's account's tier
// has it: how the route decides, and how the support desk reads, that account's key. The policy
// keeps its name, so the key of the same algorithm (and what it already counted) stays: a
// customer who used 8 of 10 and moves to a tier of 5 is refused until the log ages. A tier with
// a PIX queue puts the PIX on a leaky_bucket of that many places (a key of its own). A queue,
// the tier's or the route's own at the tier's limit (a lower limit paces its turns further
// apart), has no more places than turns come within maxWait, at least one (0: no queue is
// shortened), as the configuration sets a route's.
func limitOf(t *pix.Tiers, maxWait time.Duration, l enforce.RouteLimit, s auth.Subject, statement bool) enforce.RouteLimit {
	tier := figures(t, s)
	p := tier.PIXLimit
	if statement {
		p = tier.StatementLimit
	}
	if p > 0 {
		l.Policy.Limit = p
		if l.Policy.Algorithm.Bursty() && l.Policy.Burst < p {
			l.Policy.Burst = p
		}
	}
	if q := tier.PIXQueue; q > 0 && !statement {
		queued := l
		queued.Policy.Algorithm, queued.Policy.Burst, queued.Policy.Queue = ratelimit.LeakyBucket, 0, q
		if queued.Policy.Pace() >= time.Millisecond { // a limit too high to pace keeps the route's own algorithm
			l = queued
		}
	}
	if pace := l.Policy.Pace(); l.Policy.Algorithm == ratelimit.LeakyBucket && maxWait > 0 && pace > 0 &&
		time.Duration(l.Policy.Queue)*pace > maxWait {
		l.Policy.Queue = max(1, int(maxWait/pace))
	}
	return l
}
