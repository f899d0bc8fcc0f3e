package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Warm readies rdb, the client of a replica's Limiter, for its first burst, to be called once
// before the replica listens:
// the first decisions of a cold replica otherwise pay, inside their budget, for dialing Redis,
// for a cluster's slot map and for NOSCRIPT, the script sent in full after its hash was refused.
// Warm loads every script of the core that decides (each algorithm's and the readiness probe),
// and the layers' scripts it is given (package sequence's, slots', grants'), into Redis, on every
// node of a cluster; it
// learns the slot map; and it opens conns connections to each master, so that a burst finds
// them dialed. The error says what could not be readied; a replica may still start,
// its decisions then follow the fail modes until Redis answers.
func Warm(ctx context.Context, rdb redis.Scripter, conns int, layers ...*redis.Script) error {
	all := slices.Collect(maps.Values(scripts))
	for _, s := range append(append(all, probeScript), layers...) {
		if err := s.Load(ctx, rdb).Err(); err != nil {
			return fmt.Errorf("ratelimit: warm: load scripts: %w", err)
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
		return fmt.Errorf("ratelimit: warm: dial: %w", err)
	}
	return nil
}

// pinger is a client whose Ping takes a connection of the pool: a *redis.Client, or a client
// around one.
type pinger interface {
	Ping(ctx context.Context) *redis.StatusCmd
}
