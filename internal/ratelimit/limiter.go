package ratelimit

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrUnavailable is wrapped by every error that means Redis could not decide in time: the
// caller then applies the policy's FailMode.
var ErrUnavailable = errors.New("rate limiter unavailable")

// FailMode says what a policy does when Redis cannot decide within the budget.
type FailMode int

const (
	// FailClosed refuses the request: the safe choice where an unlimited route is a risk
	// (login, money). It is the zero value, so a policy fails closed unless it says otherwise.
	FailClosed FailMode = iota
	// FailOpen serves the request unlimited: the choice where unavailability costs more than
	// abuse (reading one's own statement).
	FailOpen
)

// ParseFailMode parses "open" or "closed".
func ParseFailMode(s string) (FailMode, error) {
	switch s {
	case "closed":
		return FailClosed, nil
	case "open":
		return FailOpen, nil
	}
	return 0, fmt.Errorf("fail mode %q: want open or closed", s)
}

func (m FailMode) String() string {
	if m == FailOpen {
		return "open"
	}
	return "closed"
}

// Policy is one limit: Limit requests per identity per Window, counted by Algorithm. With the
// default, SlidingLog, that is at most Limit requests in any interval of length Window.
type Policy struct {
	// Name identifies the policy in Redis keys and in the RateLimit-Policy header; it must be
	// 1–32 of [a-z0-9_-].
	Name string
	// Limit is the number of requests admitted per window (for TokenBucket and GCRA, the
	// sustained rate: Limit per Window), at least 1.
	Limit int
	// Window is the window's length: a whole number of milliseconds, at least 1ms.
	Window time.Duration
	// Algorithm counts; the zero value is SlidingLog.
	Algorithm Algorithm
	// Burst is, for TokenBucket and GCRA only, how many requests may come at once: the bucket's
	// capacity. Zero means Limit. Other algorithms take no Burst.
	Burst int
	// FailMode applies when Redis cannot decide; the zero value is FailClosed.
	FailMode FailMode
}

// algorithm is p.Algorithm with its default.
func (p Policy) algorithm() Algorithm {
	if p.Algorithm == "" {
		return SlidingLog
	}
	return p.Algorithm
}

// burst is the most requests p admits at once: Burst (default Limit) for a bucket, else Limit.
func (p Policy) burst() int {
	if p.algorithm().bursty() && p.Burst > 0 {
		return p.Burst
	}
	return p.Limit
}

// Validate reports what makes p unusable, if anything.
func (p Policy) Validate() error {
	if len(p.Name) == 0 || len(p.Name) > 32 {
		return fmt.Errorf("policy name %q: want 1-32 characters", p.Name)
	}
	for _, r := range p.Name {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return fmt.Errorf("policy name %q: want only [a-z0-9_-]", p.Name)
		}
	}
	if p.Limit < 1 {
		return fmt.Errorf("policy %s: limit %d: want at least 1", p.Name, p.Limit)
	}
	if p.Window < time.Millisecond || p.Window%time.Millisecond != 0 {
		return fmt.Errorf("policy %s: window %v: want a whole number of milliseconds, at least 1ms", p.Name, p.Window)
	}
	if _, err := ParseAlgorithm(string(p.Algorithm)); err != nil {
		return fmt.Errorf("policy %s: %w", p.Name, err)
	}
	if p.Burst < 0 || p.Burst > 0 && !p.algorithm().bursty() {
		return fmt.Errorf("policy %s: burst %d: only token_bucket and gcra take a burst (at least 1)", p.Name, p.Burst)
	}
	// The sliding window and the token bucket multiply counts by the window in microseconds;
	// Lua numbers are exact integers only below 2^53.
	if a := p.algorithm(); (a == SlidingWindow || a == TokenBucket) &&
		float64(max(p.Limit, p.burst()))*float64(p.Window.Microseconds()) >= 1<<53 {
		return fmt.Errorf("policy %s: limit × window too large (%d × %v)", p.Name, max(p.Limit, p.burst()), p.Window)
	}
	return nil
}

// Check asks whether one more request of Identity fits Policy. Identity is anything stable that
// names the client (an account id, a CPF, IPIdentity of an address); it is hashed before it
// reaches Redis.
type Check struct {
	Policy   Policy
	Identity string
}

// Result is the state of one check after a decision.
type Result struct {
	// Policy is the policy checked.
	Policy Policy
	// Allowed reports whether this key had room. In a Decision over several keys a key may have
	// room while another refuses: the request is then refused and recorded in neither.
	Allowed bool
	// Limit is the most requests the key admits at once: Policy.Limit, or for TokenBucket and
	// GCRA the burst. Remaining counts down from it.
	Limit int
	// Remaining is how many more requests the key admits now, after this one if it was recorded.
	Remaining int
	// Reset is the time until the key has room for one more request than Remaining says: the
	// moment its oldest counted request leaves the window. Zero only for an empty key.
	Reset time.Duration
	// RetryAfter is zero when Allowed; otherwise it equals Reset, the earliest time at which the
	// same request would be admitted if no other traffic arrives.
	RetryAfter time.Duration
}

// Decision is the outcome of one request over one or more checks. Its embedded Result is the
// worst of Results, the one reported to the client: least Remaining, and on a tie the longer
// Reset. Decision.Allowed is the verdict for the request as a whole.
type Decision struct {
	Result
	// Results holds one Result per check, in the order the checks were given.
	Results []Result
}

// Only returns the Decision as if it had checked only its i-th check: the request's verdict,
// with that check's Result as the worst and only one.
func (d Decision) Only(i int) Decision {
	return Decision{Result: d.Results[i], Results: d.Results[i : i+1 : i+1]}
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
	// FailClosedRetryAfter is the Retry-After sent when a FailClosed policy cannot decide.
	// Default 5s.
	FailClosedRetryAfter time.Duration
	// Logger receives outage reports, at most one per policy per OutageLogEvery. Default
	// slog.Default().
	Logger *slog.Logger
	// OutageLogEvery throttles outage reports. Default 10s.
	OutageLogEvery time.Duration
}

// Limiter decides requests against policies whose state lives in Redis. It is safe for
// concurrent use, and any number of Limiters on any number of hosts sharing one Redis and one
// KeySecret enforce one limit together.
type Limiter struct {
	rdb        redis.Scripter
	cluster    bool // rdb is a Redis Cluster client: keys of one decision may live on different nodes
	keys       *keyer
	timeout    time.Duration
	retryAfter time.Duration
	outages    *outageLog

	// now, when set (tests only), replaces the Redis clock.
	now func() time.Time
	// withdrawals counts undo.lua calls in flight (withdraw.go), for Close to wait on.
	withdrawals sync.WaitGroup
	// late holds a slot per withdrawal of a late decision in flight (withdrawLate).
	late chan struct{}
	// withdrawn, when set (tests only), learns how long each withdrawn admission was held.
	withdrawn func(held time.Duration)
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
	if opts.Prefix == "" {
		opts.Prefix = "rl"
	}
	if opts.Timeout == 0 {
		opts.Timeout = 100 * time.Millisecond
	}
	if opts.FailClosedRetryAfter == 0 {
		opts.FailClosedRetryAfter = 5 * time.Second
	}
	if opts.Timeout < 0 || opts.FailClosedRetryAfter < 0 || opts.OutageLogEvery < 0 {
		return nil, errors.New("ratelimit: negative duration in options")
	}
	if opts.OutageLogEvery == 0 {
		opts.OutageLogEvery = 10 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	_, cluster := rdb.(*redis.ClusterClient)
	return &Limiter{
		rdb:        rdb,
		cluster:    cluster,
		keys:       newKeyer(opts.Prefix, opts.KeySecret),
		timeout:    opts.Timeout,
		retryAfter: opts.FailClosedRetryAfter,
		outages:    newOutageLog(opts.Logger, opts.OutageLogEvery),
		late:       make(chan struct{}, maxLateWithdrawals),
	}, nil
}

// ClientOptions tunes Redis client options for a decision budget: every dial, read, write and
// pool wait ends by the budget, the context deadline is honoured, and neither a failed dial nor a
// failed command is retried (the route's fail mode answers instead). Call it on options from redis.ParseURL.
func ClientOptions(opt *redis.Options, budget time.Duration) {
	opt.DialTimeout = budget
	opt.ReadTimeout = budget
	opt.WriteTimeout = budget
	opt.PoolTimeout = budget
	opt.ContextTimeoutEnabled = true
	opt.MaxRetries = -1
	opt.DialerRetries = 1
}

// UniversalClientOptions is ClientOptions for the options of a cluster or sentinel client.
func UniversalClientOptions(opt *redis.UniversalOptions, budget time.Duration) {
	opt.DialTimeout = budget
	opt.ReadTimeout = budget
	opt.WriteTimeout = budget
	opt.PoolTimeout = budget
	opt.ContextTimeoutEnabled = true
	opt.MaxRetries = -1
	opt.DialerRetries = 1
}

// Allow is shorthand for AllowAll with one check.
func (l *Limiter) Allow(ctx context.Context, p Policy, identity string) (Result, error) {
	d, err := l.AllowAll(ctx, Check{Policy: p, Identity: identity})
	return d.Result, err
}

// AllowAll decides one request against every check at once, in one atomic script and one round
// trip: the request is admitted only if every key has room, and is then recorded in every key;
// otherwise it is recorded in none. The error wraps ErrUnavailable when Redis did not answer
// within the budget; the Decision is then zero and the caller applies the fail mode (Enforce
// does).
func (l *Limiter) AllowAll(ctx context.Context, checks ...Check) (Decision, error) {
	return l.decide(ctx, requestID(), checks)
}

// decide runs the script for the request named id. Running it again with the same id never
// records the request twice.
func (l *Limiter) decide(ctx context.Context, id string, checks []Check) (Decision, error) {
	if len(checks) == 0 {
		return Decision{}, errors.New("ratelimit: no checks")
	}
	keys := make([]string, len(checks))
	args := make([]any, 2, 2+3*len(checks))
	args[0], args[1] = id, ""
	if l.now != nil {
		args[1] = l.now().UnixMicro()
	}
	algorithm := checks[0].Policy.algorithm()
	for i, c := range checks {
		if err := c.Policy.Validate(); err != nil {
			return Decision{}, fmt.Errorf("ratelimit: %w", err)
		}
		if c.Policy.algorithm() != algorithm {
			return Decision{}, fmt.Errorf("ratelimit: one decision mixes %s and %s: checks decided together share an algorithm", algorithm, c.Policy.algorithm())
		}
		keys[i] = l.keys.key(c.Policy, c.Identity)
		args = append(args, c.Policy.Limit, c.Policy.Window.Microseconds(), c.Policy.burst())
	}

	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	if l.cluster && len(checks) > 1 {
		return l.decideApart(ctx, algorithm, keys, args, checks)
	}
	reply, err := run(ctx, l.rdb, algorithm, keys, args)
	if err != nil {
		l.refreshTopology()
		l.withdrawLate(algorithm, keys, id, err)
		return Decision{}, err
	}
	return newDecision(reply[0] == 1, reply[1:len(reply)-1], checks), nil
}

// run runs an algorithm's script and checks the shape of its reply:
// {allowed, remaining_1, reset_1, ..., now}.
func run(ctx context.Context, rdb redis.Scripter, a Algorithm, keys []string, args []any) ([]int64, error) {
	reply, err := scripts[a].Run(ctx, rdb, keys, args...).Int64Slice()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if len(reply) != 2+2*len(keys) {
		return nil, fmt.Errorf("%w: script returned %d values for %d keys", ErrUnavailable, len(reply), len(keys))
	}
	return reply, nil
}

// newDecision builds a Decision from the script's per-key (remaining, reset µs) pairs.
func newDecision(allowed bool, pairs []int64, checks []Check) Decision {
	d := Decision{Results: make([]Result, len(checks))}
	for i, c := range checks {
		r := Result{
			Policy:    c.Policy,
			Limit:     c.Policy.burst(),
			Remaining: int(pairs[2*i]),
			Reset:     time.Duration(pairs[2*i+1]) * time.Microsecond,
		}
		// A key had room if the request was recorded, or if it still has room without it.
		r.Allowed = allowed || r.Remaining > 0
		if !r.Allowed {
			r.RetryAfter = r.Reset
		}
		d.Results[i] = r
		if i == 0 || r.Remaining < d.Remaining || r.Remaining == d.Remaining && r.Reset > d.Reset {
			d.Result = r
		}
	}
	// The worst key of a refused request is a full one (the others keep Remaining > 0), so the
	// embedded Result already says "refused" and carries the longest RetryAfter among full keys.
	d.Allowed = allowed
	return d
}

// requestID returns a fresh random member for the sorted sets: 72 bits, so two requests never
// share one, even in the same microsecond, and 12 characters, so a key stays small. It needs to
// be unique, not secret, so math/rand/v2's per-thread generator serves, with no system call.
func requestID() string {
	var b [9]byte
	binary.LittleEndian.PutUint64(b[:], rand.Uint64())
	b[8] = byte(rand.Uint32())
	return base64.RawURLEncoding.EncodeToString(b[:])
}
