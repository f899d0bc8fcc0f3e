package ratelimit

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
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
	// Fallback says the request was decided in a replica's memory (package fallback), at its share
	// of each limit, because Redis could not decide.
	Fallback bool
	// Wait is, for a queue's decision (LeakyBucket), how long until the request's turn: an
	// admission with a Wait above zero is held until then (package queue). Zero for the meters.
	Wait time.Duration
	// Place is an admitted queue decision's place in its queue, for the caller that waits, or
	// that gives it back unused (package queue).
	Place *Place
}

// Only returns the Decision as if it had checked only its i-th check: the same verdict, with
// that check's Result as the worst and only one.
func (d Decision) Only(i int) Decision {
	return Decision{Allowed: d.Allowed, Worst: d.Results[i], Results: d.Results[i : i+1 : i+1], DenyCached: d.DenyCached, Fallback: d.Fallback,
		Wait: d.Wait, Place: d.Place}
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
	// Prefix starts every key. Default DefaultPrefix.
	Prefix string
	// Timeout is the budget of one decision, Redis round trip included. Default 100ms.
	Timeout time.Duration
	// Cluster says that the client is a Redis Cluster client, whose keys of one decision may
	// live on different nodes. New recognizes a *redis.ClusterClient by itself; set Cluster
	// when the client wraps one.
	Cluster bool
	// Runner runs each decision's script: Scripts(rdb) by default, or layers around it that
	// batch (package batch) or withdraw what a caller did not get (package withdraw, which a
	// cluster client needs: it decides each key apart). Every other call (a probe, a sequence)
	// runs its script alone.
	Runner Runner
	// Sequences, when set, runs a Decide of several steps on one Redis in one script call,
	// atomic (package sequence's). Without it each step is a call of its own.
	Sequences SequenceRunner
	// Now, when set, is the time every call gives its script instead of Redis's clock, and the
	// Limiter's own clock: tests step through windows without sleeping. Never in production,
	// where the replicas' clocks differ and Redis's is the one they share.
	Now func() time.Time
}

// Limiter decides requests against policies whose state lives in Redis. It is safe for
// concurrent use, and any number of Limiters on any number of hosts sharing one Redis and one
// KeySecret enforce one limit together.
type Limiter struct {
	rdb     redis.Scripter
	cluster bool // keys of one decision may live on different nodes (its Runner splits them)
	keys    *keyer
	timeout time.Duration

	// runner runs the decisions' scripts (Options.Runner); sequences, a Decide's several steps
	// (Options.Sequences).
	runner    Runner
	sequences SequenceRunner
	// stats counts what the limiter did, for Stats.
	stats stats
	// down is set while the last decision could not reach Redis (Stats.RedisUp).
	down atomic.Bool
	// args holds each policy's script arguments, boxed once (policyArgs).
	argsMu sync.RWMutex
	args   map[Policy][3]any

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
	if opts.Timeout < 0 {
		return nil, errors.New("ratelimit: negative timeout")
	}
	if opts.Prefix == "" {
		opts.Prefix = DefaultPrefix
	}
	if opts.Timeout == 0 {
		opts.Timeout = 100 * time.Millisecond
	}
	_, isCluster := rdb.(*redis.ClusterClient)
	l := &Limiter{
		rdb:     rdb,
		cluster: opts.Cluster || isCluster,
		keys:    newKeyer(opts.Prefix, opts.KeySecret),
		timeout: opts.Timeout,
		args:    make(map[Policy][3]any),
		now:     opts.Now,

		sequences: opts.Sequences,
	}
	if l.runner = opts.Runner; l.runner == nil {
		if l.cluster {
			return nil, errors.New("ratelimit: a cluster client needs a Runner that decides each key apart (package withdraw's, with Split)")
		}
		l.runner = Scripts(rdb)
	}
	return l, nil
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

// Probe runs probe.lua on rdb, on the key prefix+":probe" (prefix "" is DefaultPrefix): what
// Ready asks, and what a layer that must know whether Redis can decide asks (the breaker's
// probe). The error wraps ErrUnavailable.
func Probe(ctx context.Context, rdb redis.Scripter, prefix string) error {
	if err := probeScript.Run(ctx, rdb, []string{cmp.Or(prefix, DefaultPrefix) + ":probe"}).Err(); err != nil {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return nil
}

// AllowAll decides one request against every check at once, in one atomic script and one round
// trip: the request is admitted only if every key has room, and is then recorded in every key;
// otherwise it is recorded in none. The checks' policies must be valid and share an algorithm
// (ValidateTogether, at startup). The error wraps ErrUnavailable when Redis did not answer
// within the budget (or a breaker around the client is open); the caller then applies the fail
// mode (package outages logs the outage).
func (l *Limiter) AllowAll(ctx context.Context, checks ...Check) (Decision, error) {
	if len(checks) == 0 {
		return Decision{}, errors.New("ratelimit: no checks")
	}
	return l.do(ctx, Op{kind: opDecide}, checks)
}

// do asks the Runner for one decision of checks by their algorithm's script: AllowAll's, and each
// algorithm step's of a Decide run step by step. o is what the script does.
func (l *Limiter) do(ctx context.Context, o Op, checks []Check) (Decision, error) {
	if err := oneQueue(checks); err != nil {
		return Decision{}, err
	}
	a := checks[0].Policy.algorithm()
	sc := l.stepCall(ctx, checks, decideScript(a, o))
	l.stats.redis.Add(1)
	budget, cancel := context.WithTimeout(ctx, l.timeout)
	r, err := l.runner.Run(budget, a, sc.Keys, sc.Call)
	cancel()
	l.called(ctx, err)
	if err != nil {
		return Decision{}, err
	}
	return decisionOf(r, checks, sc.Keys, sc.Call), nil
}

// keysOf are the Redis keys of checks.
func (l *Limiter) keysOf(checks []Check) []string {
	keys := make([]string, len(checks))
	for i, c := range checks {
		keys[i] = l.keys.key(c.Policy, c.Identity)
	}
	return keys
}

// called tells the Redis-up flag how a call went.
func (l *Limiter) called(ctx context.Context, err error) {
	switch {
	case err == nil:
		if l.down.Load() { // a write on every decision would bounce one cache line between cores
			l.down.Store(false)
		}
	case errors.Is(err, ErrUnavailable) && ctx.Err() == nil: // a client that left is no outage
		l.down.Store(true)
	}
}

// decisionOf is the Decision of the reply r to call c over checks and their keys: a queue's
// admission also holds its wait and its place, to wait for or to give back.
func decisionOf(r Reply, checks []Check, keys []string, c Call) Decision {
	d := NewDecision(r.Allowed, r.Pairs, checks)
	if queued(checks) {
		d.Wait = time.Duration(r.Wait) * time.Microsecond
		if r.Allowed && c.Op.Takes() {
			d.Place = &Place{Key: keys[0], Owner: checks[0].Identity, ID: c.ID, Turn: r.Now + r.Wait, Decided: r.Now, Policy: checks[0].Policy}
		}
	}
	return d
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
// ("" is DefaultPrefix).
func ForgetChannel(prefix string) string { return cmp.Or(prefix, DefaultPrefix) + ":{fleet}:forget" }

// DefaultPrefix starts every key of a Limiter whose Options name no Prefix, and the fleet's
// channels and roster of its layers.
const DefaultPrefix = "rl"

// Key is the Redis key of c: the policy and the keyed hash of the identity (never the identity
// in clear), as a support desk's audit names it.
func (l *Limiter) Key(c Check) string { return l.keys.key(c.Policy, c.Identity) }

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
}

type stats struct{ redis atomic.Int64 }

// Stats returns the Limiter's counters.
func (l *Limiter) Stats() Stats {
	return Stats{Redis: l.stats.redis.Load(), RedisUp: !l.down.Load()}
}

// queueOp is a queue's decision op: a place whose turn comes within ctx's deadline, if it has one,
// less the decision's own budget: the script reads its clock after the call's way there, and the
// waiter starts its timer after the way back.
func (l *Limiter) queueOp(ctx context.Context) Op {
	o := Op{kind: opQueue, within: -1}
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

// NewDecision is the Decision of a script's reply: allowed, and per check its (remaining, reset µs)
// pair, as the scripts answer and a layer that decides in memory answers alike (package fallback).
func NewDecision(allowed bool, pairs []int64, checks []Check) Decision {
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

// RequestID returns a fresh random member for the sorted sets: 72 bits, so two requests never
// share one, even in the same microsecond, and 12 characters, so a key stays small. It needs to
// be unique, not secret, so math/rand/v2's per-thread generator serves, with no system call.
func RequestID() string {
	var b [9]byte
	binary.LittleEndian.PutUint64(b[:], mrand.Uint64())
	b[8] = byte(mrand.Uint32())
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// Publish publishes msg on channel by publish.lua, a script as every call a Limiter's client
// makes: what a layer tells the fleet (package queue's moved turns).
func Publish(ctx context.Context, rdb redis.Scripter, channel, msg string) error {
	return publishScript.Run(ctx, rdb, []string{channel}, msg).Err()
}
