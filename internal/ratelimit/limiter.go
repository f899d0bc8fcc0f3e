package ratelimit

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	mrand "math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrUnavailable is wrapped by every error that means Redis could not decide in time: the
// caller then applies its fail mode (serve the request unlimited, or refuse it).
var ErrUnavailable = errors.New("rate limiter unavailable")

// ErrNotSent is wrapped by the error of a call failed unsent (an open breaker): it did not run.
var ErrNotSent = errors.New("not sent")

// MayHaveRun reports whether a failed call may have run in Redis, then or later: anything but a
// failure that surely sent nothing (a dial that failed, a pool with no connection to give, an open
// breaker) or a reply of Redis's own refusing to run it (an error reply: BUSY, LOADING, READONLY,
// OOM, ...). A timeout, a reset or an EOF after the script was sent may have run it; so may a
// script that failed as it ran ("ERR user_script:…", Redis 7's reply to a Lua error): Redis does
// not roll a script back, and a batch's or a sequence's earlier members may have been recorded
// before a later one failed. (Package withdraw takes back what such a call may have admitted; a
// support desk's reset of a key answers that it may have been made.)
func MayHaveRun(err error) bool {
	var re redis.Error
	var oe *net.OpError
	switch {
	case errors.As(err, &re) && !errors.Is(err, context.DeadlineExceeded): // Redis answered
		return strings.HasPrefix(re.Error(), "ERR user_script:")
	case errors.Is(err, redis.ErrPoolTimeout), errors.Is(err, redis.ErrClosed), errors.Is(err, ErrNotSent):
		return false
	case errors.As(err, &oe) && oe.Op == "dial":
		return false
	}
	return true
}

// Check asks whether one more request of Identity fits Policy. Identity is anything stable that
// names the client (an account id, a CPF, IPIdentity of an address), hashed before Redis.
type Check struct {
	Policy   Policy
	Identity string
}

// Result is the state of one check's key after a decision.
type Result struct {
	Policy   Policy // the policy checked
	Capacity int    // the most requests the key admits at once (Policy.Capacity)
	// Remaining is how many more requests the key admits now, after this one if it was recorded.
	Remaining int
	// Reset is the time until the key admits one more request than Remaining says (with the
	// sliding log, until its oldest counted request leaves the window). Zero only for an empty key.
	Reset time.Duration
	// RetryAfter is Reset when the request was refused and this key is full, else zero: the
	// earliest time the same request fits this key if no other traffic arrives.
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
	// DenyCached says a deny cache refused it without asking Redis (package denycache): Worst is
	// a key known to be full; keys not known full carry their Capacity as Remaining.
	DenyCached bool
	// Fallback says it was decided in a replica's memory, at its share of each limit, because
	// Redis could not decide (package fallback).
	Fallback bool
	// Wait and Place are a queue's (LeakyBucket): how long until the request's turn, and an
	// admission's place, to wait for or give back (package queue).
	Wait  time.Duration
	Place *Place
	// taken is what an admission recorded, for Withdraw: its zero value when it recorded nothing
	// (a value, not a pointer: an admission allocates nothing more for it).
	taken taken
}

// Recorded says whether d is an admission Redis recorded (what Withdraw takes back): false for a
// refusal, an ask, and an answer a layer gave from its memory (package queue reports the steps
// before one it refuses so admitted, unasked).
func (d Decision) Recorded() bool { return d.taken.a != "" }

// taken is what an admission of algorithm a recorded in keys by call, decided at at (µs).
type taken struct {
	a    Algorithm
	keys []string
	call Call
	at   int64
}

// A Decider decides requests: a Limiter, or a layer in front of one (package denycache).
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
	// Cluster says that the keys of one decision may live on different nodes: New sees a
	// *redis.ClusterClient by itself; set it when the client wraps one.
	Cluster bool
	// Runner runs each decision's script: Scripts(rdb) by default, or a layer around it that
	// batches (package batch) or withdraws what a caller did not get (package withdraw's, which
	// a cluster needs: it decides each key apart).
	Runner Runner
	// Sequences, when set, runs a Decide of several steps in one atomic script call (package
	// sequence's; wrapped by package withdraw's Runner.Sequences, a lost reply's admissions are
	// taken back). Without it each step is a call of its own.
	Sequences SequenceRunner
	// Now, when set, replaces Redis's clock: tests step through windows without sleeping. Never
	// in production, where the replicas' clocks differ and Redis's is the one they share.
	Now func() time.Time
}

// Limiter decides requests against policies whose state lives in Redis. It is safe for
// concurrent use; Limiters sharing one Redis and one KeySecret enforce one limit together.
type Limiter struct {
	rdb       redis.Scripter
	cluster   bool
	keys      *keyer
	timeout   time.Duration
	runner    Runner
	sequences SequenceRunner
	now       func() time.Time // Options.Now

	redisCalls atomic.Int64 // Stats.Redis
	down       atomic.Bool  // the last decision could not reach Redis (Stats.RedisUp)
	argsMu     sync.RWMutex
	args       map[Policy][3]any // each policy's script arguments, boxed once (policyArgs)
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
// pool wait ends by the budget, the context deadline is honoured, and nothing is retried (the
// route's fail mode answers instead).
func ClientOptions(opt *redis.Options, budget time.Duration) {
	budgeted(budget, &opt.DialTimeout, &opt.ReadTimeout, &opt.WriteTimeout, &opt.PoolTimeout,
		&opt.ContextTimeoutEnabled, &opt.MaxRetries, &opt.DialerRetries)
}

// UniversalClientOptions is ClientOptions for a cluster or sentinel client's options.
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
// that writes, as every decision does (a breaker around the client, open, fails it at once).
// The error wraps ErrUnavailable. A replica not ready answers by its fail modes only.
func (l *Limiter) Ready(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	return Probe(ctx, l.rdb, l.keys.prefix)
}

// Probe runs probe.lua on rdb, on the key prefix+":probe" ("" is DefaultPrefix): what Ready
// asks, and a layer that must know whether Redis can decide (the breaker). The error wraps
// ErrUnavailable.
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
// within the budget; the caller then applies its fail mode.
func (l *Limiter) AllowAll(ctx context.Context, checks ...Check) (Decision, error) {
	if len(checks) == 0 {
		return Decision{}, errors.New("ratelimit: no checks")
	}
	if err := oneQueue(checks); err != nil {
		return Decision{}, err
	}
	return l.one(ctx, checks, decideScript(checks[0].Policy.algorithm(), Op{kind: opDecide}), true)
}

// one decides checks in one call, within the budget, as st says: an algorithm's by the Runner
// (byRunner: batched, withdrawn), a layer's step by its own script.
func (l *Limiter) one(ctx context.Context, checks []Check, st StepScript, byRunner bool) (Decision, error) {
	sc := l.stepCall(ctx, checks, st)
	l.redisCalls.Add(1)
	budget, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	var r Reply
	var err error
	if byRunner {
		r, err = l.runner.Run(budget, Algorithm(st.Body), sc.Keys, sc.Call)
	} else if r, err = runScript(budget, l.rdb, st.Alone, st.Queued, sc.Keys, sc.Call); err != nil {
		err = fmt.Errorf("%s: %w", st.Body, err)
	}
	l.called(ctx, err)
	if err != nil {
		return Decision{}, err
	}
	return decisionOf(r, checks, sc.Keys, sc.Call), nil
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
	if r.Allowed && c.Op.Takes() {
		d.taken = taken{a: checks[0].Policy.algorithm(), keys: keys, call: c, at: r.Now}
	}
	if queued(checks) {
		d.Wait = time.Duration(r.Wait) * time.Microsecond
		if r.Allowed && c.Op.Takes() {
			d.Place = &Place{Key: keys[0], Owner: checks[0].Identity, ID: c.ID, Turn: r.Now + r.Wait, Decided: r.Now, Policy: checks[0].Policy}
		}
	}
	return d
}

// Withdraw takes back what d, an admission of this Limiter's, recorded, as if it had been
// refused: a request that a later step of its own then refused (a PIX admitted by its limit,
// and refused by its look-up's charge once the ledger said its key is nobody's). A sorted-set
// log removes the request by its id, the packed log one entry of its time; a counter or a bucket
// gives one back (what has left its window counts nowhere). One call, within the budget (on a
// Redis Cluster, one per key, at once: the keys may live on different nodes); none when d
// recorded nothing (a refusal, an answer from a layer's memory). The error wraps ErrUnavailable.
func (l *Limiter) Withdraw(ctx context.Context, d Decision) error {
	t := d.taken
	if t.a == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	w := t.call.Withdrawal(t.at, t.call.Now)
	run := func(keys []string, c Call) error {
		l.redisCalls.Add(1)
		return Script(t.a).Run(ctx, l.rdb, keys, c.Args()...).Err()
	}
	var err error
	if !l.cluster || len(t.keys) == 1 {
		err = run(t.keys, w)
	} else {
		errs := make([]error, len(t.keys))
		var wg sync.WaitGroup
		for i := range t.keys {
			wg.Go(func() {
				errs[i] = run(t.keys[i:i+1], w.Only(i))
			})
		}
		wg.Wait()
		err = errors.Join(errs...)
	}
	if err != nil {
		err = fmt.Errorf("%w: withdraw: %w", ErrUnavailable, err)
	}
	l.called(ctx, err)
	return err
}

// Forget clears c's key in Redis: the identity starts afresh (a support desk unblocking a
// customer). A deny cache's Forget also tells the fleet's caches (package denycache).
func (l *Limiter) Forget(ctx context.Context, c Check) error {
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	if err := forgetScript.Run(ctx, l.rdb, []string{l.Key(c)}).Err(); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("%w: forget: %w", ErrUnavailable, err)
	}
	return nil
}

// DefaultPrefix starts every key of a Limiter whose Options name no Prefix, and the fleet's
// channels and roster of its layers.
const DefaultPrefix = "rl"

// Key is the Redis key of c: the policy and the keyed hash of the identity (never the identity
// in clear), as a support desk's audit names it.
func (l *Limiter) Key(c Check) string { return l.keys.key(c.Policy, c.Identity) }

// Stats is what a Limiter did since it was made, and whether Redis answers it now.
type Stats struct {
	Redis   int64 // decisions sent to its client (a breaker may have failed some unsent)
	RedisUp bool  // the last decision that asked Redis got an answer (true before any)
}

// Stats returns the Limiter's counters.
func (l *Limiter) Stats() Stats { return Stats{Redis: l.redisCalls.Load(), RedisUp: !l.down.Load()} }

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
			// Bounded, so that no state a script misreads can overflow a Duration into a
			// negative Retry-After (TestALongerWindowLocksNoKey).
			Reset: time.Duration(min(pairs[2*i+1], maxResetMicros)) * time.Microsecond,
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

// maxResetMicros is the longest Reset a reply can say: a Duration's range, in µs.
const maxResetMicros = int64(math.MaxInt64 / time.Microsecond)

// RequestID returns a fresh random member for the sorted sets: 72 bits, so two requests never
// share one, in 12 characters. Unique, not secret: math/rand/v2 serves, with no system call.
func RequestID() string {
	var b [9]byte
	binary.LittleEndian.PutUint64(b[:], mrand.Uint64())
	b[8] = byte(mrand.Uint32())
	return base64.RawURLEncoding.EncodeToString(b[:])
}
