package ratelimit

import (
	"context"
	"sync"
	"time"
)

// decideApart decides a request whose keys may live on different Redis Cluster nodes, where one
// script cannot see them all (CROSSSLOT). Each key is decided by its own script, all at once,
// under the same request id and within the same budget. If every key admits, the request is
// admitted and recorded everywhere, as on one node. If any key refuses, or cannot answer, the
// admissions the others made are withdrawn (each script's withdrawal mode), so a refused request
// consumes no quota in the end; the withdrawals run after the answer is sent, so they never delay it.
//
// The price: between a key's admission and its withdrawal (about one round trip after the
// decision, measured by TestClusterExactness) a refused request holds one place in that key, and
// a concurrent request on the same key can be refused that one script over all keys would have
// admitted. The error is only ever on the strict side: the split never admits more than the
// limit.
func (l *Limiter) decideApart(ctx context.Context, a Algorithm, keys []string, args []any, checks []Check) (Decision, error) {
	replies := make([][]int64, len(keys))
	errs := make([]error, len(keys))
	var wg sync.WaitGroup
	for i := range keys {
		wg.Go(func() {
			replies[i], errs[i] = run(ctx, l.rdb, a, keys[i:i+1], append(args[:3:3], args[3+3*i:6+3*i]...))
		})
	}
	wg.Wait()
	decided := time.Now()

	allowed, failed := true, error(nil)
	for i := range keys {
		switch {
		case errs[i] != nil:
			failed = errs[i]
		case replies[i][0] == 0:
			allowed = false
		}
	}
	pairs := make([]int64, 0, 2*len(keys))
	for i := range keys {
		if errs[i] != nil {
			l.withdrawLate(a, keys[i:i+1], append(args[:3:3], args[3+3*i:6+3*i]...), errs[i]) // it may still run late
		}
		if errs[i] == nil && replies[i][0] == 1 && (!allowed || failed != nil) {
			l.withdraw(a, keys[i], args[0], replies[i][3], args[3+3*i:6+3*i], decided)
			replies[i][1]++ // the place it held is given back
		}
		if errs[i] == nil {
			pairs = append(pairs, replies[i][1], replies[i][2])
		}
	}
	if failed != nil {
		l.refreshTopology()
		return Decision{}, failed
	}
	return newDecision(allowed, pairs, checks), nil
}

// refreshTopology asks a cluster client to reload the slot map after a failed decision. go-redis
// reloads by itself on MOVED and ASK, and otherwise only every ClusterStateReloadInterval (a
// minute): after a master dies and its replica is promoted, nothing redirects the client, which
// would keep dialing the dead node. The reload is asynchronous and coalesced, so a burst of
// failures costs a few CLUSTER SLOTS, not one each.
func (l *Limiter) refreshTopology() {
	if rc, ok := l.rdb.(interface{ ReloadState(context.Context) }); ok {
		rc.ReloadState(context.Background())
	}
}
