package httpapi

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/pixlimit/pixlimit/internal/auth"
	"github.com/pixlimit/pixlimit/internal/enforce"
	"github.com/pixlimit/pixlimit/internal/pix"
	"github.com/pixlimit/pixlimit/internal/ratelimit"
)

// tierTable is a TierStore that holds one table.
type tierTable struct {
	pix.TierStore
	table pix.TierTable
}

func (s tierTable) TierTable(context.Context) (pix.TierTable, error) { return s.table, nil }
func (s tierTable) TierVersion(context.Context) (int64, error)       { return s.table.Version, nil }

// A queue has no more places than turns come within the longest wait, at the pace of the
// account's tier: a tier that lowers a queued route's limit paces its turns further apart, and the
// configuration's places for the route's own pace would advertise turns past the wait, which the
// script refuses.
func TestATiersQueueFitsTheLongestWait(t *testing.T) {
	t.Parallel()
	tiers := map[string]pix.Tier{}
	for _, tier := range pix.DefaultTiers {
		tiers[tier.Name] = tier
	}
	accounts := map[string]pix.TierOf{"acct-restricted": {Tier: "restricted"}, "acct-payroll": {Tier: "payroll"}, "acct-pf": {Tier: "pf"}}
	ts := pix.NewTiers(t.Context(), tierTable{table: pix.TierTable{Version: 1, Tiers: tiers, Accounts: accounts}},
		slog.New(slog.NewTextHandler(io.Discard, nil)), time.Hour)
	t.Cleanup(ts.Close)
	const maxWait = 8700 * time.Millisecond // the default configuration's
	queued := func(name string, limit, queue int) enforce.RouteLimit {
		return enforce.RouteLimit{Policy: ratelimit.Policy{Name: name, Limit: limit, Window: time.Minute, Algorithm: ratelimit.LeakyBucket, Queue: queue}}
	}
	log := enforce.RouteLimit{Policy: ratelimit.Policy{Name: "pix", Limit: 10, Window: time.Minute}}
	for _, tc := range []struct {
		name       string
		route      enforce.RouteLimit
		account    string
		statement  bool
		wantLimit  int
		wantQueue  int
		wantQueued bool
	}{
		{"a queued PIX at its person's tier keeps the route's places", queued("pix", 10, 1), "acct-pf", false, 10, 1, true},
		{"a queued PIX at a lower limit keeps one place, at least", queued("pix", 10, 1), "acct-restricted", false, 5, 1, true},
		{"a queued statement at a lower limit loses the places past the wait", queued("statement", 30, 4), "acct-restricted", true, 10, 1, true},
		{"the payroll tier's queue, as many places as turns come in the wait", log, "acct-payroll", false, 60, 8, true},
		{"a logged PIX at a lower limit stays unqueued", log, "acct-restricted", false, 5, 0, false},
	} {
		got := limitOf(ts, maxWait, tc.route, auth.Subject{Account: tc.account}, tc.statement).Policy
		if got.Limit != tc.wantLimit || got.Queue != tc.wantQueue || (got.Algorithm == ratelimit.LeakyBucket) != tc.wantQueued {
			t.Errorf("%s: limit %d, queue %d, %s; want limit %d, queue %d, queued %v", tc.name, got.Limit, got.Queue, got.Algorithm,
				tc.wantLimit, tc.wantQueue, tc.wantQueued)
		}
		if got.Queue > 1 && time.Duration(got.Queue)*got.Pace() > maxWait {
			t.Errorf("%s: %d places of %v, past the wait of %v", tc.name, got.Queue, got.Pace(), maxWait)
		}
	}
}
