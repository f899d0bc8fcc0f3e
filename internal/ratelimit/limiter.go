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
	// DenyCached says the request was refused by a deny cache (package denycache), without
	// asking Redis: Worst is a key known to be full, and the Results of keys not known to be full
	// carry their Capacity as Remaining, since nothing was asked of them.
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

// A Decider decides requests: a Limiter, or a layer in front of one that answers some itself
// (package denycache).
type Decider interface {
	AllowAll(ctx context.Context, checks ...Check) (Decision, error)
	Decide(ctx context.Context, steps ...Step) (Decisions, error)
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
	defaultFallbackLogSize = 100_000
	defaultMaxWaiting      = 1000
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
	if opts.Timeout < 0 || opts.OutageLogEvery < 0 {
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
	if l.runner = opts.Runner; l.runner == nil {
		if l.cluster {
			return nil, errors.New("ratelimit: a cluster client needs a Runner that decides each key apart (package withdraw's, with Split)")
		}
		l.runner = Scripts(rdb)
	}
	l.fallback = newFallbackLog(cmp.Or(opts.FallbackLogSize, defaultFallbackLogSize))
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

// listen hears, until Close, the turns of a queue that moved up when a waiter on another replica
// left (queueChannel). go-redis resubscribes after a lost connection; a message sent meanwhile is
// missed (see queue.go).
func (l *Limiter) listen(s subscriber) {
	l.sub = s.Subscribe(context.Background(), l.queueChannel())
	l.listening.Add(1) // Close waits for it
	go func() {
		defer l.listening.Done()
		for msg := range l.sub.Channel() {
			l.moved(msg.Payload)
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
func (l *Limiter) AllowAll(ctx context.Context, checks ...Check) (Decision, error) {
	if len(checks) == 0 {
		return Decision{}, errors.New("ratelimit: no checks")
	}
	return l.do(ctx, Op{kind: opDecide}, checks)
}

// Forget clears c's key in Redis, on every replica at once: the identity starts afresh (a
// support desk unblocking a customer). The key is announced on ForgetChannel, where the
// replicas' deny caches (package denycache) hear of it and drop it.
func (l *Limiter) Forget(ctx context.Context, c Check) error {
	key := l.keys.key(c.Policy, c.Identity)
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	if _, err := forgetScript.Run(ctx, l.rdb, []string{key}).Result(); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("%w: forget: %w", ErrUnavailable, err)
	}
	if err := publishScript.Run(ctx, l.rdb, []string{ForgetChannel(l.keys.prefix)}, key).Err(); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("%w: forget: %w", ErrUnavailable, err)
	}
	return nil
}

// ForgetChannel is the Redis channel Forget publishes each forgotten key on, for keys of prefix
// ("" is the default, "rl").
func ForgetChannel(prefix string) string { return cmp.Or(prefix, "rl") + ":{fleet}:forget" }

// Key is the Redis key of c: the policy and the keyed hash of the identity (never the identity
// in clear), as a support desk's audit names it.
func (l *Limiter) Key(c Check) string { return l.keys.key(c.Policy, c.Identity) }

// do is the one path of every call that asks Redis (AllowAll, a Decide of one step): the outage
// log, the Redis-up flag and the counters apply to each alike. o is what the script does.
func (l *Limiter) do(ctx context.Context, o Op, checks []Check) (Decision, error) {
	if err := oneQueue(checks); err != nil {
		return Decision{}, err
	}
	keys := l.keysOf(checks)
	if queued(checks) {
		if o.kind == opDecide && l.waiters.full(checks[0].Identity) {
			return l.tooManyWaiting(checks), nil // no place taken: the replica cannot hold one more
		}
		o = l.queueOp(ctx, o)
	}
	l.stats.redis.Add(1)
	d, err := l.decide(ctx, o, checks, keys)
	l.called(ctx, err, checks)
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
	// RedisUp says the last decision that asked Redis got an answer (true before any).
	RedisUp bool
	// FleetSize is how many replicas share the limits: those the heartbeat last counted while
	// Redis answered, and never fewer than Options.FleetSize (replicas starting together first
	// count themselves alone; a single replica in local mode is then stricter than it need be).
	FleetSize int
	// Waiting is how many requests this replica holds until their turns in a queue (Wait).
	Waiting int
}

type stats struct{ redis atomic.Int64 }

// Stats returns the Limiter's counters.
func (l *Limiter) Stats() Stats {
	return Stats{Redis: l.stats.redis.Load(), RedisUp: !l.down.Load(), FleetSize: int(l.fleet.Load()),
		Waiting: int(l.waiters.count.Load())}
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
