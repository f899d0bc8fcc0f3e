// Package denycache is the deny cache: a layer around a ratelimit.Limiter that remembers, per
// key, until when this replica knows the key is full, and refuses a request on it here, with no
// Redis call. It owns that memory, its bounds and the subscription that empties it.
//
// What it buys: under attack almost every request is a refusal of a full key, and each is then
// answered from memory, at about the price of a bare 429, and keeps answering while Redis is
// down. What it costs: up to Options.Size entries of memory (TestDenyCacheMemory measures one),
// one subscription per replica, and, when Redis loses its state (a restart without
// persistence, a failover, an operator's DEL) or another replica frees room early (a refund, a
// withdrawal, a place left in a queue), refusals on the strict side for at most Options.Hold.
//
// It never refuses a request that Redis would admit. A refusal by Redis at its time T says the
// key has no room until T + Reset, and, for every algorithm, nothing any replica does can bring
// that moment nearer: a refused request records nothing; the sliding log's entries only leave by
// ageing; the sliding window's estimate and the buckets' levels only decay with time, and
// admissions, the only other change, make room later, not sooner; the fixed window ends on its
// calendar. The deadline is counted from when this replica sent the request, on its monotonic
// clock: Redis decided later, so the key's true unblocking is never before sent + Reset. It can
// be up to one round trip after it, which costs one extra Redis call, never a wrong refusal.
// Only a withdrawal (of a late decision, of a cluster split's admission, or of one its caller
// shed: Forgotten) and a token bucket's refund (ratelimit.RefundStep) free room early: a refund
// clears its keys here, as a desk's Forget clears its key on every replica and a caller that
// withdrew an admission clears its checks (Forgotten), and a refusal still on its way back when
// they do is not learnt (entries); a split decision is never cached (Options.Cluster); the rest
// is seen within the hold. A queue's refusal (leaky_bucket) is never learnt: its places leave
// early, and it refuses a request whose turn would come after that request's own deadline while
// places are free, which says nothing of the next request (package queue refuses from memory
// what this replica's waiters fill).
package denycache

import (
	"cmp"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pixlimit/pixlimit/internal/ratelimit"
)

// Options configure a Cache. The zero value of each field has a default.
type Options struct {
	// Size bounds the keys the cache remembers as full (default 100,000: about 38 MB), and the
	// recent forgets it remembers besides (as many: about 9.5 MB and their keys).
	Size int
	// Hold is the longest the cache keeps a block before asking Redis again, even when the key
	// stays full longer. Default 5s.
	Hold time.Duration
	// Cluster says the Limiter splits a decision's keys (a Redis Cluster): a refused split
	// decision's sibling admissions are withdrawn, which frees room early, so such a refusal is
	// never cached.
	Cluster bool
	// Timeout bounds Forget's announcement, as ratelimit.Options.Timeout a decision. Default 100ms.
	Timeout time.Duration
	// Now is the cache's clock, as ratelimit.Options.Now: tests only.
	Now func() time.Time
}

// Cache is a ratelimit.Decider: its AllowAll and Decide answer from memory what they can, and
// ask the Limiter the rest.
type Cache struct {
	l       *ratelimit.Limiter
	entries *entries
	hold    time.Duration
	cluster bool
	now     func() time.Time
	refused atomic.Int64

	rdb       redis.UniversalClient // announces and hears forgotten keys (nil: neither)
	prefix    string
	timeout   time.Duration
	sub       *redis.PubSub
	listening sync.WaitGroup
}

// New returns a deny cache in front of l. When rdb can subscribe, the cache hears at once of a
// key forgotten on any replica (ForgetChannel of prefix, l's key prefix: "" is the
// default); a message missed while the subscription reconnects is forgotten within the hold.
func New(l *ratelimit.Limiter, rdb redis.UniversalClient, prefix string, opts Options) (*Cache, error) {
	if opts.Size < 0 || opts.Hold < 0 {
		return nil, errors.New("denycache: negative size or hold")
	}
	c := &Cache{l: l, entries: newEntries(cmp.Or(opts.Size, 100_000)), hold: cmp.Or(opts.Hold, 5*time.Second),
		cluster: opts.Cluster, now: opts.Now, rdb: rdb, prefix: prefix, timeout: cmp.Or(opts.Timeout, 100*time.Millisecond)}
	if c.now == nil {
		c.now = time.Now
	}
	if rdb != nil {
		c.sub = rdb.Subscribe(context.Background(), ForgetChannel(prefix))
		c.listening.Add(1) // Close waits for it
		go func() {
			defer c.listening.Done()
			for msg := range c.sub.Channel() {
				c.entries.forget(c.now(), msg.Payload)
			}
		}()
	}
	return c, nil
}

// AllowAll is ratelimit.Limiter.AllowAll, answered from memory when a key is known to be full.
func (c *Cache) AllowAll(ctx context.Context, checks ...ratelimit.Check) (ratelimit.Decision, error) {
	sent, seen := c.now(), c.entries.seen()
	if d, ok := c.refuse(checks, sent); ok {
		return d, nil
	}
	d, err := c.l.AllowAll(ctx, checks...)
	if err == nil {
		c.learn(d, checks, sent, seen)
	}
	return d, err
}

// Decide is ratelimit.Limiter.Decide, its first step answered from memory when one of its keys is
// known to be full (Decision.DenyCached), exactly as the script would refuse it, recording
// nothing; this holds while Redis is down too. The RetryAfter of such a refusal is the key's own,
// which can be longer than the hold. A later step's key known to be full is asked of Redis, which
// refuses it (KnownFull asks the cache first). Every step's refusal teaches the cache (learn),
// unless a refund among the steps may have made room.
func (c *Cache) Decide(ctx context.Context, steps ...ratelimit.Step) (ratelimit.Decisions, error) {
	sent, seen := c.now(), c.entries.seen() // before asking Redis, which decides later: deadlines from here are never late
	refunded := c.refundedKeys(steps)
	c.entries.forget(sent, refunded...) // the refund makes room
	if len(steps) > 0 && steps[0].Script().Cacheable {
		if d, ok := c.refuse(steps[0].Checks(), sent); ok {
			return ratelimit.DecisionsOf(steps, d), nil
		}
	}
	ds, err := c.l.Decide(ctx, steps...)
	if len(refunded) > 0 {
		c.entries.forget(c.now(), refunded...) // and again once made: a refusal Redis decided before it may come back after
		return ds, err
	}
	for _, s := range steps {
		if d, ran := ds.Of(s); ran && s.Script().Cacheable {
			c.learn(d, s.Checks(), sent, seen)
		}
	}
	return ds, err
}

// refundedKeys are the keys of the steps that refund, in which a refund makes room.
func (c *Cache) refundedKeys(steps []ratelimit.Step) []string {
	var keys []string
	for _, s := range steps {
		if s.Script().Refunds {
			for _, ch := range s.Checks() {
				keys = append(keys, c.l.Key(ch))
			}
		}
	}
	return keys
}

// KnownFull answers checks as AllowAll would from memory alone, with no call: refused
// (Decision.DenyCached) when one of their keys is known to be full, ok false otherwise. A caller
// whose Decide asks something first and then decides checks can answer at once, when ok, what
// the steps would end with: asks take nothing, so not asking them changes nothing.
func (c *Cache) KnownFull(checks ...ratelimit.Check) (ratelimit.Decision, bool) {
	return c.refuse(checks, c.now())
}

// ErrNotAnnounced is Forget's answer when the key was forgotten, in Redis and here, but the
// announcement to the other replicas failed: the change is made, and their caches forget the key
// within Options.Hold.
var ErrNotAnnounced = errors.New("denycache: key forgotten, not announced to the other replicas (they forget it within the hold)")

// Forget is ratelimit.Limiter.Forget, and every replica's cache forgets the key: this one at
// once, the others when they hear of it on ForgetChannel (forgotten.lua). The key forgotten but
// not announced is ErrNotAnnounced.
func (c *Cache) Forget(ctx context.Context, ch ratelimit.Check) error {
	key := c.l.Key(ch)
	err := c.l.Forget(ctx, ch)
	c.entries.forget(c.now(), key) // after Redis forgot: a refusal decided before may still come back
	if err != nil || c.rdb == nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	if err := forgottenScript.Run(ctx, c.rdb, []string{ForgetChannel(c.prefix)}, key).Err(); err != nil {
		return fmt.Errorf("%w: %w", ErrNotAnnounced, err)
	}
	return nil
}

// ForgetChannel is the Redis channel on which Forget announces each forgotten key, for keys of
// prefix ("" is the default).
func ForgetChannel(prefix string) string {
	return cmp.Or(prefix, ratelimit.DefaultPrefix) + ":{fleet}:forget"
}

//go:embed forgotten.lua
var forgottenSource string

var forgottenScript = redis.NewScript(forgottenSource)

// Forgotten drops checks' keys from this replica's cache: what a caller does that knows their
// limits changed (a re-tiered account).
func (c *Cache) Forgotten(checks ...ratelimit.Check) {
	for _, ch := range checks {
		c.entries.forget(c.now(), c.l.Key(ch))
	}
}

// Stats is what a Cache did and holds.
type Stats struct {
	// Refused is how many requests the cache refused, without asking Redis.
	Refused int64
	// Keys is how many keys it holds (expired ones until they are seen).
	Keys int
}

// Stats returns the cache's counters.
func (c *Cache) Stats() Stats { return Stats{Refused: c.refused.Load(), Keys: c.entries.len()} }

// Close ends the subscription and waits for its reader. The Limiter stays the caller's.
func (c *Cache) Close() error {
	if c.sub != nil {
		_ = c.sub.Close()
	}
	c.listening.Wait()
	return nil
}

// learn teaches the cache what a decision over checks sent at sent, having seen seen forgets,
// says of their keys (a key forgotten since is not learnt: entries). A refusal blocks its full
// keys until their RetryAfter, unless its keys may see withdrawals that free room early: a split
// decision on a cluster, whose sibling admissions are withdrawn, is never cached. An admission
// that left a bucket without a token (a cost taken into debt) blocks it until Reset.
func (c *Cache) learn(d ratelimit.Decision, checks []ratelimit.Check, sent time.Time, seen uint64) {
	switch {
	case len(checks) > 0 && checks[0].Policy.Algorithm == ratelimit.LeakyBucket: // a queue's (one key): never learnt
	case !d.Allowed && !(c.cluster && len(checks) > 1):
		for i, r := range d.Results {
			// Redis's TIME counts whole microseconds, so its now can be up to 1µs behind
			// the true moment it decided: the entry stops answering that microsecond early.
			if wait := r.RetryAfter - time.Microsecond; wait > 0 {
				c.entries.block(c.l.Key(checks[i]), checks[i], seen, sent.Add(min(wait, c.hold)), sent.Add(r.RetryAfter))
			}
		}
	case d.Allowed && len(checks) == 1 && checks[0].Policy.Algorithm == ratelimit.TokenBucket:
		if r := d.Worst; r.Remaining == 0 && r.Reset > time.Microsecond {
			wait := r.Reset - time.Microsecond
			c.entries.block(c.l.Key(checks[0]), checks[0], seen, sent.Add(min(wait, c.hold)), sent.Add(r.Reset))
		}
	}
}

// refuse refuses a request over checks if any of their keys is known to be full at now, as the
// script would: recording nothing, reporting the blocked key with the longest wait. Keys not
// known to be full are reported with their Capacity as Remaining, since nothing was asked of them.
func (c *Cache) refuse(checks []ratelimit.Check, now time.Time) (ratelimit.Decision, bool) {
	var d ratelimit.Decision // built only when a key is blocked: the common path allocates nothing here
	for i, ch := range checks {
		until, ok := c.entries.blockedUntil(ch, now)
		if !ok {
			continue
		}
		if d.Results == nil {
			d = ratelimit.Decision{DenyCached: true, Results: make([]ratelimit.Result, len(checks))}
			for j, ch := range checks {
				d.Results[j] = ratelimit.Result{Policy: ch.Policy, Capacity: ch.Policy.Capacity(), Remaining: ch.Policy.Capacity()}
			}
		}
		r := ratelimit.Result{Policy: ch.Policy, Capacity: ch.Policy.Capacity(), Reset: until.Sub(now), RetryAfter: until.Sub(now)}
		if d.Worst.Policy.Name == "" || r.Reset > d.Worst.Reset {
			d.Worst = r
		}
		d.Results[i] = r
	}
	if d.Results == nil {
		return d, false
	}
	c.refused.Add(1)
	return d, true
}
