package withdraw

import (
	"context"
	"sync"
	"time"

	"github.com/pixlimit/pixlimit/internal/ratelimit"
)

// split decides a request whose keys may live on different Redis Cluster nodes, where one script
// cannot see them all (CROSSSLOT). Each key is decided by its own script, all at once, under the
// same request id and within the same budget. If every key admits, the request is admitted and
// recorded everywhere, as on one node. If any key refuses, or cannot answer, the admissions the
// others made are withdrawn (each script's withdraw operation), so a refused request consumes no
// quota in the end; the withdrawals run after the answer is sent, so they never delay it. A
// request that only asks (AskStep), or gives back (RefundStep), took nothing, and nothing is withdrawn.
//
// The reply is the one a script over every key would give: admitted only if all admitted, each
// key's remaining and reset in order (a withdrawn admission's place counted as given back), and
// the latest of the keys' times.
func (r *Runner) split(ctx context.Context, a ratelimit.Algorithm, keys []string, c ratelimit.Call) (ratelimit.Reply, error) {
	replies := make([]ratelimit.Reply, len(keys))
	errs := make([]error, len(keys))
	var wg sync.WaitGroup
	for i := range keys {
		wg.Go(func() {
			replies[i], errs[i] = r.next.Run(ctx, a, keys[i:i+1], c.Only(i))
		})
	}
	wg.Wait()
	decided := time.Now()

	out := ratelimit.Reply{Allowed: true, Pairs: make([]int64, 0, 2*len(keys))}
	var failed error
	for i := range keys {
		switch {
		case errs[i] != nil:
			failed = errs[i]
		case !replies[i].Allowed:
			out.Allowed = false
		}
	}
	for i := range keys {
		if errs[i] != nil {
			r.WithdrawLate(a, keys[i:i+1], c.Only(i), errs[i]) // it may still run late
			continue
		}
		if c.Op.Takes() && replies[i].Allowed && (!out.Allowed || failed != nil) {
			r.withdraw(a, keys[i], c.Only(i), replies[i].Now, decided)
			replies[i].Pairs[0]++ // the place it held is given back
		}
		out.Pairs = append(out.Pairs, replies[i].Pairs...)
		out.Now = max(out.Now, replies[i].Now)
	}
	if failed != nil {
		r.refreshTopology()
		return ratelimit.Reply{}, failed
	}
	return out, nil
}

// refreshTopology asks a cluster client to reload the slot map after a failed decision. go-redis
// reloads by itself on MOVED and ASK, and otherwise only every ClusterStateReloadInterval (a
// minute): after a master dies and its replica is promoted, nothing redirects the client, which
// would keep dialing the dead node. The reload is asynchronous and coalesced, so a burst of
// failures costs a few CLUSTER SLOTS, not one each.
func (r *Runner) refreshTopology() {
	if rc, ok := r.rdb.(interface{ ReloadState(context.Context) }); ok {
		rc.ReloadState(context.Background())
	}
}
