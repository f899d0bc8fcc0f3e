package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// decideApart decides a request whose keys may live on different Redis Cluster nodes, where one
// script cannot see them all (CROSSSLOT). Each key is decided by its own script, all at once,
// under the same request id and within the same budget. If every key admits, the request is
// admitted and recorded everywhere, as on one node. If any key refuses, or cannot answer, the
// admissions the others made are withdrawn (each script's withdraw operation), so a refused request
// consumes no quota in the end; the withdrawals run after the answer is sent, so they never delay it.
//
// The price: between a key's admission and its withdrawal (about one round trip after the
// decision, measured by TestClusterExactness) a refused request holds one place in that key, and
// a concurrent request on the same key can be refused that one script over all keys would have
// admitted. The error is only ever on the strict side: the split never admits more than the
// limit. A request that only asks (AskAll) took nothing, and nothing is withdrawn.
func (l *Limiter) decideApart(ctx context.Context, a Algorithm, keys []string, c Call, checks []Check) (Decision, error) {
	replies := make([]Reply, len(keys))
	errs := make([]error, len(keys))
	var wg sync.WaitGroup
	for i := range keys {
		wg.Go(func() {
			replies[i], errs[i] = run(ctx, l.rdb, a, keys[i:i+1], c.Only(i))
		})
	}
	wg.Wait()
	decided := time.Now()

	allowed, failed := true, error(nil)
	for i := range keys {
		switch {
		case errs[i] != nil:
			failed = errs[i]
		case !replies[i].Allowed:
			allowed = false
		}
	}
	pairs := make([]int64, 0, 2*len(keys))
	for i := range keys {
		if !c.Op.Takes() { // an ask or a refund took nothing: there is nothing to withdraw
			if errs[i] == nil {
				pairs = append(pairs, replies[i].Pairs...)
			}
			continue
		}
		if errs[i] != nil {
			l.withdrawLate(a, keys[i:i+1], c.Only(i), checks[i:i+1], errs[i]) // it may still run late
		}
		if errs[i] == nil && replies[i].Allowed && (!allowed || failed != nil) {
			l.withdraw(a, keys[i], c.Only(i), replies[i].Now, checks[i].Policy, decided)
			replies[i].Pairs[0]++ // the place it held is given back
		}
		if errs[i] == nil {
			pairs = append(pairs, replies[i].Pairs...)
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

// Warm readies the Limiter for its first burst, to be called once before its replica listens:
// the first decisions of a cold replica otherwise pay, inside their budget, for dialing Redis,
// for a cluster's slot map and for NOSCRIPT, the script sent in full after its hash was refused.
// Warm loads every script that decides (each algorithm's, the sequences',
// the voucher's, the slots' and the readiness probe) into Redis, on every node of a cluster; it
// learns the slot map; and it opens conns connections to each master, so that a burst finds
// them dialed. The error says what could not be readied; a replica may still start,
// its decisions then follow the fail modes until Redis answers.
func (l *Limiter) Warm(ctx context.Context, conns int) error {
	all := slices.Collect(maps.Values(scripts))
	for _, s := range sequenceScripts {
		all = append(all, s.script)
	}
	for _, s := range append(all, probeScript, voucherScript, slotScript) {
		if err := s.Load(ctx, l.rdb).Err(); err != nil {
			return fmt.Errorf("ratelimit: warm: load scripts: %w", err)
		}
	}
	dial := func(ctx context.Context, c *redis.Client) error {
		errs := make([]error, max(conns, 1))
		var wg sync.WaitGroup
		for i := range errs {
			wg.Go(func() { errs[i] = c.Ping(ctx).Err() }) // at once: each needs a connection of its own
		}
		wg.Wait()
		return errors.Join(errs...)
	}
	var err error
	switch c := l.rdb.(type) {
	case *redis.ClusterClient: // ForEachMaster loads the slot map first
		err = c.ForEachMaster(ctx, dial)
	case *redis.Client:
		err = dial(ctx, c)
	}
	if err != nil {
		return fmt.Errorf("ratelimit: warm: dial: %w", err)
	}
	return nil
}
