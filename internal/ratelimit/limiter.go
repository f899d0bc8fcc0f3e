package ratelimit

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrUnavailable is wrapped by every error that means Redis could not decide in time: the
// caller then applies its fail mode (serve the request unlimited, or refuse it).
var ErrUnavailable = errors.New("rate limiter unavailable")

// ErrNotSent is wrapped by the error of a call that a client between the Limiter and Redis failed
// without sending it (an open breaker, package breaker): it surely did not run.
var ErrNotSent = errors.New("not sent")

// Check asks whether one more request of Identity fits Policy. Identity is anything stable that
// names the client (an account id, a CPF, IPIdentity of an address); it is hashed before it
// reaches Redis.
type Check struct {
	Policy   Policy
	Identity string
}

// Result is the state of one check's key after a decision.
type Result struct {
	// Policy is the policy checked.
	Policy Policy
	// Capacity is the most requests the key admits at once: Policy.Capacity(), which is the
	// burst for TokenBucket and GCRA and Policy.Limit otherwise. Remaining counts down from it.
	Capacity int
	// Remaining is how many more requests the key admits now, after this one if it was recorded.
	Remaining int
	// Reset is the time until the key admits one more request than Remaining says (with the
	// sliding log, until its oldest counted request leaves the window). Zero only for an empty key.
	Reset time.Duration
	// RetryAfter is zero unless the request was refused and this key is full: it is then Reset,
	// the earliest time at which the same request fits this key if no other traffic arrives.
	RetryAfter time.Duration
}

// Decision is the outcome of one request over one or more checks.
type Decision struct {
	// Allowed is the verdict for the request as a whole: admitted, and recorded in every key.
	Allowed bool
	// Worst is the Result to report to the client: least Remaining, and on a tie the longer
	// Reset. When the request is refused it is a full key, with the longest RetryAfter of them.
	Worst Result
	// Results holds one Result per check, in the order the checks were given.
	Results []Result
	// DenyCached says the request was refused by this Limiter's deny cache, without asking Redis:
	// Worst is a key known to be full, and the Results of keys not known to be full carry their
	// Capacity as Remaining, since nothing was asked of them.
	DenyCached bool
	// Fallback says the request was decided in this Limiter's memory (AllowFallback), at its share
	// of each limit, because Redis could not decide.
	Fallback bool
	// Wait is, for a queue's decision (LeakyBucket), how long until the request's turn: an
	// admission with a Wait above zero is held until then by Limiter.Wait. Zero for the meters.
	Wait time.Duration

	place *place // an admitted queue decision's place in its queue, for Wait
}

// Only returns the Decision as if it had checked only its i-th check: the same verdict, with
// that check's Result as the worst and only one.
func (d Decision) Only(i int) Decision {
	return Decision{Allowed: d.Allowed, Worst: d.Results[i], Results: d.Results[i : i+1 : i+1], DenyCached: d.DenyCached, Fallback: d.Fallback,
		Wait: d.Wait, place: d.place}
}

// Options configure a Limiter. The zero value of each field but KeySecret has a default.
type Options struct {
	// KeySecret keys the HMAC that turns identities into Redis keys, so that no CPF or IP is
	// stored in clear. At least 16 bytes; every replica must use the same one.
	KeySecret []byte
	// Prefix starts every key. Default "rl".
	Prefix string
	// Timeout is the budget of one decision, Redis round trip included. Default 100ms.
	Timeout time.Duration
	// Cluster says that the client is a Redis Cluster client, whose keys of one decision may
	// live on different nodes. New recognizes a *redis.ClusterClient by itself; set Cluster
	// when the client wraps one.
	Cluster bool
	// Logger receives outage reports, at most one per policy per OutageLogEvery. Default
	// slog.Default().
	Logger *slog.Logger
	// OutageLogEvery throttles outage reports. Default 10s.
	OutageLogEvery time.Duration
	// DenyCacheSize bounds the keys this Limiter remembers as full, to refuse requests on them
	// without asking Redis (see denyCache). Default 100,000 (about 15 MB); negative disables.
	DenyCacheSize int
	// DenyCacheHold is the longest the deny cache keeps a block before asking Redis again, even
	// when the key stays full longer: if Redis loses its state (a restart, a failover, an
	// operator's DEL), a replica refuses on stale knowledge for at most this long. Default 5s.
	DenyCacheHold time.Duration
	// FleetSize is the fewest replicas AllowFallback assumes share the limits (its share is
	// ⌈Limit / fleet size⌉). Zero: 1, and no heartbeat; above zero, the Limiter beats in Redis
	// every second and counts the replicas that do (no identity in it), never fewer than this,
	// and learns the keys Forget cleared on other replicas.
	FleetSize int
	// FallbackLogSize bounds the keys AllowFallback remembers. Default 100,000.
	FallbackLogSize int
	// Runner runs each decision's script: Scripts(rdb) by default, or layers around it that
	// batch (package batch) or withdraw what a caller did not get (package withdraw, which a
	// cluster client needs: it decides each key apart). Every other call (a probe, a sequence)
	// runs its script alone.
	Runner Runner
	// Now, when set, is the time every call gives its script instead of Redis's clock, and the
	// Limiter's own clock: tests step through windows without sleeping. Never in production,
	// where the replicas' clocks differ and Redis's is the one they share.
	Now func() time.Time
	// MaxWaiting is the most requests this Limiter holds until their turns at once (Wait), over
	// every queue (LeakyBucket), one key (an account's queue) at most half of them (at least 1):
	// past it, a queue's request is refused at once. Default 1000.
	MaxWaiting int
}

// Option defaults that are not zero.
const (
	defaultDenyCacheSize = 100_000
	defaultDenyCacheHold = 5 * time.Second
	defaultMaxWaiting    = 1000
)

// Limiter decides requests against policies whose state lives in Redis. It is safe for
// concurrent use, and any number of Limiters on any number of hosts sharing one Redis and one
// KeySecret enforce one limit together.
type Limiter struct {
	id      string // this Limiter among the fleet's: its heartbeat's name, its queue messages' sender
	rdb     redis.Scripter
	cluster bool // keys of one decision may live on different nodes (its Runner splits them)
	keys    *keyer
	timeout time.Duration
	outages *outageLog
	logger  *slog.Logger

	// deny remembers keys known to be full (denycache.go), each for at most hold; nil when disabled.
	deny *denyCache
	hold time.Duration
	// runner runs the decisions' scripts (Options.Runner).
	runner Runner
	// fleet is the fleet's size as the heartbeat last counted it, at least fleetFloor (fallback.go).
	fleet      atomic.Int64
	fleetFloor int64
	// fallback decides in memory while Redis cannot (AllowFallback).
	fallback *fallbackLog
	// waiters are the requests held until their turns in a queue (queue.go).
	waiters *waiters
	// stats counts what the limiter did, for Stats.
	stats stats
	// down is set while the last decision could not reach Redis (Stats.RedisUp).
	down atomic.Bool
	// args holds each policy's script arguments, boxed once (policyArgs).
	argsMu sync.RWMutex
	args   map[Policy][3]any

	// background counts the heartbeat, for Close to wait on.
	background sync.WaitGroup
	// closing is closed by Close: the heartbeat stops.
	closing   chan struct{}
	closeOnce sync.Once

	// sub is the subscription listen reads, when the client can subscribe; Close ends it, and
	// waits for listening.
	sub       *redis.PubSub
	listening sync.WaitGroup

	// now, when set (tests only: Options.Now), replaces the Redis clock.
	now func() time.Time
}

// New returns a Limiter that keeps its state in rdb. Configure the client with ClientOptions so
// that no decision waits past the budget.
func New(rdb redis.Scripter, opts Options) (*Limiter, error) {
	if rdb == nil {
		return nil, errors.New("ratelimit: nil redis client")
	}
	if len(opts.KeySecret) < 16 {
		return nil, fmt.Errorf("ratelimit: key secret of %d bytes: want at least 16", len(opts.KeySecret))
	}
	if opts.Timeout < 0 || opts.OutageLogEvery < 0 || opts.DenyCacheHold < 0 {
		return nil, errors.New("ratelimit: negative duration in options")
	}
	if opts.MaxWaiting < 0 {
		return nil, errors.New("ratelimit: negative MaxWaiting")
	}
	if opts.Prefix == "" {
		opts.Prefix = "rl"
	}
	if opts.Timeout == 0 {
		opts.Timeout = 100 * time.Millisecond
	}
	if opts.OutageLogEvery == 0 {
		opts.OutageLogEvery = 10 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	_, isCluster := rdb.(*redis.ClusterClient)
	l := &Limiter{
		id:      rand.Text(),
		rdb:     rdb,
		cluster: opts.Cluster || isCluster,
		keys:    newKeyer(opts.Prefix, opts.KeySecret),
		timeout: opts.Timeout,
		logger:  opts.Logger,
		closing: make(chan struct{}),
		args:    make(map[Policy][3]any),
		waiters: newWaiters(cmp.Or(opts.MaxWaiting, defaultMaxWaiting)),
		now:     opts.Now,
	}
	l.outages = newOutageLog(opts.Logger, opts.OutageLogEvery, l.clock)
	if opts.DenyCacheSize >= 0 {
		l.deny = newDenyCache(cmp.Or(opts.DenyCacheSize, defaultDenyCacheSize))
		l.hold = cmp.Or(opts.DenyCacheHold, defaultDenyCacheHold)
	}
	if l.runner = opts.Runner; l.runner == nil {
		if l.cluster {
			return nil, errors.New("ratelimit: a cluster client needs a Runner that decides each key apart (package withdraw's, with Split)")
		}
		l.runner = Scripts(rdb)
	}
	l.fallback = newFallbackLog(cmp.Or(opts.FallbackLogSize, defaultDenyCacheSize))
	l.fleetFloor = int64(max(1, opts.FleetSize))
	l.fleet.Store(l.fleetFloor)
	if opts.FleetSize > 0 {
		l.background.Add(1) // Close waits for it
		go l.heartbeat()
	}
	if s, ok := rdb.(subscriber); ok {
		l.listen(s)
	}
	return l, nil
}

// subscriber is a Redis client that can subscribe to channels (go-redis's Client and
// ClusterClient).
type subscriber interface {
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
}

// listen hears the fleet's news until Close: the keys another replica forgot (forgetChannel),
// dropped from the deny cache at once, and the turns of a queue that moved up when a waiter on
// another replica left (queueChannel). go-redis resubscribes after a lost connection; a
// message sent meanwhile is missed (the heartbeat re-reads the forgotten keys).
func (l *Limiter) listen(s subscriber) {
	l.sub = s.Subscribe(context.Background(), l.forgetChannel(), l.queueChannel())
	l.listening.Add(1) // Close waits for it
	go func() {
		defer l.listening.Done()
		for msg := range l.sub.Channel() {
			if msg.Channel == l.queueChannel() {
				l.moved(msg.Payload)
				continue
			}
			l.Forgotten(msg.Payload)
		}
	}()
}

// ClientOptions tunes Redis client options for a decision budget: every dial, read, write and
// pool wait ends by the budget, the context deadline is honoured, and neither a failed dial nor a
// failed command is retried (the route's fail mode answers instead). Call it on options from
// redis.ParseURL.
func ClientOptions(opt *redis.Options, budget time.Duration) {
	budgeted(budget, &opt.DialTimeout, &opt.ReadTimeout, &opt.WriteTimeout, &opt.PoolTimeout,
		&opt.ContextTimeoutEnabled, &opt.MaxRetries, &opt.DialerRetries)
}

// UniversalClientOptions is ClientOptions for the options of a cluster or sentinel client (a
// type of go-redis's own that shares no fields with redis.Options).
func UniversalClientOptions(opt *redis.UniversalOptions, budget time.Duration) {
	budgeted(budget, &opt.DialTimeout, &opt.ReadTimeout, &opt.WriteTimeout, &opt.PoolTimeout,
		&opt.ContextTimeoutEnabled, &opt.MaxRetries, &opt.DialerRetries)
}

// budgeted sets the fields ClientOptions names, in whichever options type holds them.
func budgeted(budget time.Duration, dial, read, write, pool *time.Duration, contextTimeout *bool, retries, dialerRetries *int) {
	*dial, *read, *write, *pool = budget, budget, budget, budget
	*contextTimeout, *retries, *dialerRetries = true, -1, 1
}

// Ready reports whether the Limiter can decide now: Redis runs, within the budget, a script
// that writes, as every decision does. The error wraps ErrUnavailable. A replica whose Limiter is
// not ready answers its limited routes by their fail modes only, so a proxy should route
// elsewhere.
//
// A Limiter over a breaker (package breaker) fails this probe at once while the breaker is open:
// the breaker's own Ready asks Redis even then.
func (l *Limiter) Ready(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	return Probe(ctx, l.rdb, l.keys.prefix)
}

// Probe runs probe.lua on rdb, on the key prefix+":probe" (prefix "" is the default, "rl"): what
// Ready asks, and what a layer that must know whether Redis can decide asks (the breaker's
// probe). The error wraps ErrUnavailable.
func Probe(ctx context.Context, rdb redis.Scripter, prefix string) error {
	if err := probeScript.Run(ctx, rdb, []string{cmp.Or(prefix, "rl") + ":probe"}).Err(); err != nil {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return nil
}

// AllowAll decides one request against every check at once, in one atomic script and one round
// trip: the request is admitted only if every key has room, and is then recorded in every key;
// otherwise it is recorded in none. The checks' policies must be valid and share an algorithm
// (ValidateTogether, at startup). The error wraps ErrUnavailable when Redis did not answer
// within the budget (or a breaker around the client is open); the caller then applies the fail mode, and the
// outage is logged here.
//
// A request on a key this Limiter knows to be full is refused without asking Redis
// (Decision.DenyCached), exactly as the script would refuse it, recording nothing; this holds while
// Redis is down too. A block is kept until the key can have room again, or for DenyCacheHold,
// whichever is sooner; the RetryAfter of a deny-cache refusal is the key's own, which can be
// longer. A refusal teaches the cache (see learn), unless its keys may see withdrawals that
// free room early: a split decision on a cluster, whose sibling admissions are withdrawn, is
// never cached. (A late decision's withdrawal, after a timeout, can still free room in a key another
// replica has cached: for at most that key's Reset, the cache then refuses on the strict side.)
func (l *Limiter) AllowAll(ctx context.Context, checks ...Check) (Decision, error) {
	if len(checks) == 0 {
		return Decision{}, errors.New("ratelimit: no checks")
	}
	return l.do(ctx, Op{kind: opDecide}, checks)
}

// Inspect reads c's key as a decision would find it, taking nothing, from Redis alone: unlike
// a Decide of AskStep it neither consults nor teaches this Limiter's deny cache, counts in no Stats, and its
// failure counts as no outage of the Limiter's, so an operator's read (a support desk's) changes
// nothing this Limiter answers requests with. (A breaker around the client, package breaker,
// gates and counts it as any call.) Decision.Allowed says whether one more request would be admitted now.
// The error wraps ErrUnavailable.
func (l *Limiter) Inspect(ctx context.Context, c Check) (Decision, error) {
	if err := c.Policy.Validate(); err != nil {
		return Decision{}, err
	}
	a := c.Policy.algorithm()
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	r, err := run(ctx, l.rdb, a, []string{l.keys.key(c.Policy, c.Identity)}, l.newCall(a, Op{kind: opAsk}, []Check{c}))
	if err != nil {
		return Decision{}, err
	}
	return newDecision(r.Allowed, r.Pairs, []Check{c}), nil
}

// Forget clears c's key in Redis, on every replica at once: the identity starts afresh (a
// support desk unblocking a customer). This replica's deny cache drops the key now; the others
// learn it at their next heartbeat (about a second; the key is listed in the fleet's forget
// list, beside the roster, for as long as a deny-cache entry can live), and one that misses it
// (cut off from Redis) forgets it within Options.DenyCacheHold anyway. Replicas subscribed to
// ForgetChannel hear of it at once. The heartbeat runs only
// with Options.FleetSize above zero; without it, other replicas forget within the hold.
func (l *Limiter) Forget(ctx context.Context, c Check) error {
	key := l.keys.key(c.Policy, c.Identity)
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	if _, err := forgetScript.Run(ctx, l.rdb, []string{key}).Result(); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("%w: forget: %w", ErrUnavailable, err)
	}
	// The fleet's forget list and the channel it is published on share one name.
	if _, err := forgottenScript.Run(ctx, l.rdb, []string{l.forgetChannel()}, key, l.hold.Milliseconds()).Result(); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("%w: forget: %w", ErrUnavailable, err)
	}
	l.Forgotten(key)
	return nil
}

// forgetChannel is the Redis channel Forget publishes each forgotten key on. A Limiter whose
// client can subscribe hears it (listen) and learns of a forget within a round trip; the
// heartbeat is the backstop for a message missed.
func (l *Limiter) forgetChannel() string { return l.keys.prefix + ":{fleet}:forget" }

// Forgotten drops key (as Key names it) from this replica's deny cache: what a Limiter does
// when it hears of a Forget on another replica, and what a caller does that knows a key's limit
// changed (a re-tiered account).
func (l *Limiter) Forgotten(key string) {
	if l.deny != nil {
		l.deny.forget(key)
	}
}

// Key is the Redis key of c: the policy and the keyed hash of the identity (never the identity
// in clear), as a support desk's audit names it.
func (l *Limiter) Key(c Check) string { return l.keys.key(c.Policy, c.Identity) }

// forgetBlocks drops keys from this replica's deny cache: a refund is about to make room in them.
func (l *Limiter) forgetBlocks(keys []string) {
	if l.deny != nil {
		for _, k := range keys {
			l.deny.forget(k)
		}
	}
}

// do is the one path of every call that asks Redis (AllowAll, a Decide of one step): the deny cache, the
// outage log, the Redis-up flag and the counters apply to each alike. o is what the
// script does.
func (l *Limiter) do(ctx context.Context, o Op, checks []Check) (Decision, error) {
	if err := oneQueue(checks); err != nil {
		return Decision{}, err
	}
	sent := l.clock() // before asking Redis, which decides later: deadlines from here are never late
	keys := l.keysOf(checks)
	if d, ok := l.refuseCached(keys, checks, sent); ok {
		l.stats.denyCached.Add(1)
		return d, nil
	}
	if queued(checks) {
		if o.kind == opDecide && l.waiters.full(checks[0].Identity) {
			return l.tooManyWaiting(checks), nil // no place taken: the replica cannot hold one more
		}
		o = l.queueOp(ctx, o)
	}
	l.stats.redis.Add(1)
	d, err := l.decide(ctx, o, checks, keys)
	l.called(ctx, err, checks)
	if err == nil {
		l.learn(d, keys, checks, sent)
	}
	return d, err
}

// keysOf are the Redis keys of checks.
func (l *Limiter) keysOf(checks []Check) []string {
	keys := make([]string, len(checks))
	for i, c := range checks {
		keys[i] = l.keys.key(c.Policy, c.Identity)
	}
	return keys
}

// called tells the Redis-up flag, the fallback log and the outage log how a call
// over checks went.
func (l *Limiter) called(ctx context.Context, err error, checks []Check) {
	switch {
	case err == nil:
		if l.down.Load() { // a write on every decision would bounce one cache line between cores
			l.down.Store(false)
			l.fallback.forget() // Redis decides from its own state again
		}
		for _, c := range checks {
			l.outages.decided(c.Policy)
		}
	case errors.Is(err, ErrUnavailable) && ctx.Err() == nil: // a client that left is no outage
		l.down.Store(true)
		for _, c := range checks {
			l.outages.failed(c.Policy, err)
		}
	}
}

// learn teaches the deny cache what a decision sent at sent says of its keys. A refusal blocks
// its full keys until their RetryAfter, unless its keys may see withdrawals that free room early:
// a split decision on a cluster, whose sibling admissions are withdrawn, is never cached. An
// admission that left a bucket without a token (a cost taken into debt) blocks it until Reset.
func (l *Limiter) learn(d Decision, keys []string, checks []Check, sent time.Time) {
	switch {
	case l.deny == nil:
	case !d.Allowed && !(l.cluster && len(checks) > 1):
		for i, r := range d.Results {
			// Redis's TIME counts whole microseconds, so its now can be up to 1µs behind
			// the true moment it decided: the entry stops answering that microsecond early.
			if wait := r.RetryAfter - time.Microsecond; wait > 0 {
				l.deny.block(keys[i], sent.Add(min(wait, l.hold)), sent.Add(r.RetryAfter))
			}
		}
	case d.Allowed && len(checks) == 1 && checks[0].Policy.algorithm() == TokenBucket:
		if r := d.Worst; r.Remaining == 0 && r.Reset > time.Microsecond {
			wait := r.Reset - time.Microsecond
			l.deny.block(keys[0], sent.Add(min(wait, l.hold)), sent.Add(r.Reset))
		}
	}
}

// refuseCached refuses the request if any of its keys is known to be full at now, as the script
// would: recording nothing, reporting the blocked key with the longest wait. Keys not known to be
// full are reported with their Capacity as Remaining, since nothing was asked of them.
func (l *Limiter) refuseCached(keys []string, checks []Check, now time.Time) (Decision, bool) {
	if l.deny == nil {
		return Decision{}, false
	}
	var d Decision // built only when a key is blocked: the common path allocates nothing here
	for i, c := range checks {
		until, ok := l.deny.blockedUntil(keys[i], now)
		if !ok {
			continue
		}
		if d.Results == nil {
			d = Decision{DenyCached: true, Results: make([]Result, len(checks))}
			for j, c := range checks {
				d.Results[j] = Result{Policy: c.Policy, Capacity: c.Policy.Capacity(), Remaining: c.Policy.Capacity()}
			}
		}
		r := Result{Policy: c.Policy, Capacity: c.Policy.Capacity(), Reset: until.Sub(now), RetryAfter: until.Sub(now)}
		if d.Worst.Policy.Name == "" || r.Reset > d.Worst.Reset {
			d.Worst = r
		}
		d.Results[i] = r
	}
	return d, d.Results != nil
}

// clock is the replica's time: the monotonic clock, or the injected one in tests.
func (l *Limiter) clock() time.Time {
	if l.now != nil {
		return l.now()
	}
	return time.Now()
}

// Stats is what a Limiter did since it was made, and what it holds now.
type Stats struct {
	// Redis is how many decisions this Limiter sent to its client (a breaker around the client may
	// have failed some without asking Redis: its ShortCircuited counts those, with its other calls).
	Redis int64
	// DenyCached is how many requests were refused by the deny cache, without asking Redis.
	DenyCached int64
	// CachedKeys is how many keys the deny cache holds (expired ones until they are seen).
	CachedKeys int
	// RedisUp says the last decision that asked Redis got an answer (true before any).
	RedisUp bool
	// FleetSize is how many replicas share the limits: those the heartbeat last counted while
	// Redis answered, and never fewer than Options.FleetSize (replicas starting together first
	// count themselves alone; a single replica in local mode is then stricter than it need be).
	FleetSize int
	// Waiting is how many requests this replica holds until their turns in a queue (Wait).
	Waiting int
}

type stats struct{ redis, denyCached atomic.Int64 }

// Stats returns the Limiter's counters.
func (l *Limiter) Stats() Stats {
	s := Stats{Redis: l.stats.redis.Load(), DenyCached: l.stats.denyCached.Load(), RedisUp: !l.down.Load(),
		FleetSize: int(l.fleet.Load()), Waiting: int(l.waiters.count.Load())}
	if l.deny != nil {
		s.CachedKeys = l.deny.len()
	}
	return s
}

// decide runs the checks' script for o over their keys.
func (l *Limiter) decide(ctx context.Context, o Op, checks []Check, keys []string) (Decision, error) {
	a := checks[0].Policy.algorithm()
	c := l.newCall(a, o, checks)
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	r, err := l.runner.Run(ctx, a, keys, c)
	if err != nil {
		return Decision{}, err
	}
	return l.decisionOf(r, checks, keys, c), nil
}

// decisionOf is the Decision of the reply r to call c over checks and their keys: a queue's
// admission also holds its place, for Wait.
func (l *Limiter) decisionOf(r Reply, checks []Check, keys []string, c Call) Decision {
	d := newDecision(r.Allowed, r.Pairs, checks)
	if queued(checks) && r.Wait > 0 {
		d.Wait = time.Duration(r.Wait) * time.Microsecond
		if r.Allowed && c.Op.Takes() {
			d.place = &place{key: keys[0], owner: checks[0].Identity, id: c.ID, turn: r.Now + r.Wait, decided: r.Now, policy: checks[0].Policy}
		}
	}
	return d
}

// queueOp is a queue's decision op: a place whose turn comes within ctx's deadline, if it has one,
// less the decision's own budget: the script reads its clock after the call's way there, and the
// waiter starts its timer after the way back.
func (l *Limiter) queueOp(ctx context.Context, o Op) Op {
	if o.kind != opDecide {
		return o
	}
	o = Op{kind: opQueue, within: -1}
	if dl, ok := ctx.Deadline(); ok {
		o.within = max(0, (time.Until(dl) - l.timeout).Microseconds())
	}
	return o
}

// policyArgs are a policy's three script arguments (limit, window in ms, capacity), boxed once
// per policy: boxing an int above 255 allocates, and a decision would otherwise pay three.
func (l *Limiter) policyArgs(p Policy) [3]any {
	l.argsMu.RLock()
	args, ok := l.args[p]
	l.argsMu.RUnlock()
	if ok {
		return args
	}
	args = [3]any{p.Limit, p.Window.Milliseconds(), p.Capacity()}
	l.argsMu.Lock()
	if len(l.args) < 1024 { // policies are few; a caller minting new ones forever is not cached
		l.args[p] = args
	}
	l.argsMu.Unlock()
	return args
}

// newDecision builds a Decision from the script's per-key (remaining, reset µs) pairs.
func newDecision(allowed bool, pairs []int64, checks []Check) Decision {
	d := Decision{Allowed: allowed, Results: make([]Result, len(checks))}
	for i, c := range checks {
		r := Result{
			Policy:    c.Policy,
			Capacity:  c.Policy.Capacity(),
			Remaining: int(pairs[2*i]),
			Reset:     time.Duration(pairs[2*i+1]) * time.Microsecond,
		}
		if !allowed && r.Remaining == 0 {
			r.RetryAfter = r.Reset
		}
		d.Results[i] = r
		// The worst key of a refused request is a full one (the others keep Remaining > 0).
		if i == 0 || r.Remaining < d.Worst.Remaining || r.Remaining == d.Worst.Remaining && r.Reset > d.Worst.Reset {
			d.Worst = r
		}
	}
	return d
}

// requestID returns a fresh random member for the sorted sets: 72 bits, so two requests never
// share one, even in the same microsecond, and 12 characters, so a key stays small. It needs to
// be unique, not secret, so math/rand/v2's per-thread generator serves, with no system call.
func requestID() string {
	var b [9]byte
	binary.LittleEndian.PutUint64(b[:], mrand.Uint64())
	b[8] = byte(mrand.Uint32())
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// Close stops the heartbeat and the subscription's reader and waits for them. The Limiter must
// not be used after Close; the Redis client, and the Runner, stay the caller's to close.
func (l *Limiter) Close() error {
	l.closeOnce.Do(func() {
		close(l.closing)
		if l.sub != nil {
			_ = l.sub.Close() // ends listen
		}
	})
	l.background.Wait()
	l.listening.Wait()
	return nil
}
