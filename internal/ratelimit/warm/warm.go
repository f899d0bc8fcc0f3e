// Package warm readies a replica's Redis client for its first burst, before the replica listens.
//
// What it buys: a cold replica's first decisions otherwise pay, inside their budget, for dialing
// Redis, for a cluster's slot map and for NOSCRIPT (the script sent in full after its hash was
// refused), and on a busy machine a cold burst fails some of them by their fail modes
// (docs/how-it-works.md, "Warm before listening"). What it costs: a moment at start, and the
// connections it opens stay in the pool (the client's idle settings close them later). Its error
// is for the caller to log: a replica may start anyway, and its first decisions then follow the
// fail modes until Redis answers.
package warm

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/pixlimit/pixlimit/internal/ratelimit"
)

// Up loads every algorithm's script, and the layers' scripts it is given (package sequence's,
// slots', grants'), into rdb, on every node of a cluster (masters and replicas); learns a
// cluster's slot map; and opens conns connections to each master at once, so that a burst finds
// them dialed. The error says what could not be readied.
func Up(ctx context.Context, rdb redis.Scripter, conns int, layers ...*redis.Script) error {
	all := slices.Clone(layers)
	for _, a := range ratelimit.Algorithms() {
		all = append(all, ratelimit.Script(a))
	}
	for _, s := range all {
		if err := s.Load(ctx, rdb).Err(); err != nil {
			return fmt.Errorf("warm: load scripts: %w", err)
		}
	}
	dial := func(ctx context.Context, c pinger) error {
		errs := make([]error, max(conns, 1))
		var wg sync.WaitGroup
		for i := range errs {
			wg.Go(func() { errs[i] = c.Ping(ctx).Err() }) // at once: each needs a connection of its own
		}
		wg.Wait()
		return errors.Join(errs...)
	}
	var err error
	switch c := rdb.(type) {
	case *redis.ClusterClient: // ForEachMaster loads the slot map first
		err = c.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return dial(ctx, c) })
	case pinger: // a client, or a client around one (a breaker)
		err = dial(ctx, c)
	}
	if err != nil {
		return fmt.Errorf("warm: dial: %w", err)
	}
	return nil
}

// pinger is a client whose Ping takes a connection of the pool: a *redis.Client, or a client
// around one.
type pinger interface {
	Ping(ctx context.Context) *redis.StatusCmd
}
