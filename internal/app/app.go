// Package app assembles one pixlimit replica from its configuration: the one composition root.
// The API program, the demo's in-process fleet and the whole-program tests all build their
// replicas with New, as mailgun/gubernator's cmd and cluster harness both call SpawnDaemon, so
// what runs in a test is what runs in production: the same Redis client tuning, limiter,
// warm-up, ledger, token issuers, probes and metrics.
package app

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/pixlimit/pixlimit"
	"github.com/pixlimit/pixlimit/internal/auth"
	"github.com/pixlimit/pixlimit/internal/config"
	"github.com/pixlimit/pixlimit/internal/httpapi"
	"github.com/pixlimit/pixlimit/internal/memredis"
	"github.com/pixlimit/pixlimit/internal/pix"
	"github.com/pixlimit/pixlimit/internal/ratelimit"
	"github.com/pixlimit/pixlimit/internal/ratelimit/batch"
	"github.com/pixlimit/pixlimit/internal/ratelimit/breaker"
	"github.com/pixlimit/pixlimit/internal/ratelimit/denycache"
	"github.com/pixlimit/pixlimit/internal/ratelimit/fallback"
	"github.com/pixlimit/pixlimit/internal/ratelimit/grants"
	"github.com/pixlimit/pixlimit/internal/ratelimit/outages"
	"github.com/pixlimit/pixlimit/internal/ratelimit/queue"
	"github.com/pixlimit/pixlimit/internal/ratelimit/sequence"
	"github.com/pixlimit/pixlimit/internal/ratelimit/slots"
	"github.com/pixlimit/pixlimit/internal/ratelimit/warm"
	"github.com/pixlimit/pixlimit/internal/ratelimit/withdraw"
)

// Deps are what a replica may be handed instead of building it from the configuration. Every
// field may be left zero.
type Deps struct {
	// Logger receives the replica's logs. Default: discarded.
	Logger *slog.Logger
	// Registry, when set, receives the replica's metrics (httpapi.NewMetrics).
	Registry prometheus.Registerer
	// Ledger, when set, is used instead of the one the configuration names (DATABASE_URL, or an
	// in-memory one): the replicas of an in-process fleet share one. The caller closes it.
	Ledger pix.Ledger
	// PasswordCost is the bcrypt cost of the accounts' password hashes: the demo accounts are
	// seeded at it and an unknown document's dummy hash is made at it. Zero:
	// auth.DefaultPasswordCost, a real deployment's; no environment variable sets it. Tests pass
	// bcrypt.MinCost, whose comparisons the race detector does not make last a second.
	PasswordCost int
}

// Replica is one API replica: its HTTP handler over its own Redis client and limiter, and the
// ledger and token issuers its fleet shares.
type Replica struct {
	// Handler serves the API (httpapi.NewServer).
	Handler http.Handler
	// Limiter is the replica's rate limiter; its Stats tell what it did.
	Limiter *ratelimit.Limiter
	// DenyCache is the deny cache in front of the Limiter; nil when off. The outage log (package
	// outages) stands in front of it, and Queue in front of that, holding a queue's admissions
	// until their turns; Stack is the outermost, what every route decides through. Fallback
	// decides in memory while Redis cannot.
	DenyCache *denycache.Cache
	Queue     *queue.Queue
	Stack     ratelimit.Decider
	Fallback  *fallback.Fallback
	// Releases sends again the releases of in-flight slots and marks that Redis did not answer.
	Releases *slots.Retry
	// Breaker is the circuit breaker its scripts go through; nil on a cluster, or when off.
	Breaker *breaker.Breaker
	// Withdrawals take back what its decisions' callers did not get; Lost counts the losses.
	Withdrawals *withdraw.Runner
	// Ledger is the replica's ledger, as the handler sees it.
	Ledger pix.Ledger
	// Tokens issues the access tokens the replica accepts.
	Tokens *auth.Tokens
	// Admin serves the support desk (httpapi.NewAdmin), for ADMIN_ADDR; nil when it is off.
	Admin http.Handler

	probes  []httpapi.Probe
	closers []func() // in the order opened
}

// warmTimeout bounds the limiter's warm-up at start, and warmConns is how many connections it
// dials to each Redis master: a burst of about that many decisions finds them open.
const (
	warmTimeout = 5 * time.Second
	warmConns   = 16
)

// releasesWaiting bounds the releases of slots sent again at once (slots.Retry): past it, one
// frees at its lease.
const releasesWaiting = 4096

// tierPoll is how often a replica asks the ledger whether the tier table changed: a change on
// one replica is in force on the others within about this plus one query.
const tierPoll = 500 * time.Millisecond

// New builds a replica: Redis (REDIS_URL, a cluster, sentinels, or an embedded one) and its
// limiter, warmed before the replica serves; the token secret; the ledger; /readyz's probes;
// the metrics; and the handler over them. On an error New has released what it built, and the
// error says what failed. Close releases a replica.
func New(ctx context.Context, cfg config.Config, deps Deps) (*Replica, error) {
	if deps.Logger == nil {
		deps.Logger = slog.New(slog.DiscardHandler)
	}
	r := &Replica{}
	if err := r.build(ctx, cfg, deps); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// build is New's body: each thing it opens adds its closer as soon as it exists.
func (r *Replica) build(ctx context.Context, cfg config.Config, deps Deps) error {
	logger := deps.Logger
	rdb, closeRedis, err := connectRedis(cfg, logger)
	if err != nil {
		return err
	}
	r.closers = append(r.closers, closeRedis)
	secret := replicaSecret(cfg, logger)
	if err := r.startLimiter(ctx, cfg, rdb, secret, logger); err != nil {
		return err
	}
	cost := cmp.Or(deps.PasswordCost, auth.DefaultPasswordCost)
	passwords, err := auth.NewPasswords(cost)
	if err != nil {
		return err
	}
	if r.Tokens, err = auth.NewTokens(secret, cfg.TokenTTL); err != nil {
		return err
	}
	devices, err := auth.NewDevices(secret, cfg.DeviceTTL)
	if err != nil {
		return err
	}
	if r.Ledger = deps.Ledger; r.Ledger == nil {
		ledger, closeLedger, err := openLedger(ctx, cfg, cost, logger)
		if err != nil {
			return err
		}
		r.Ledger = ledger
		r.closers = append(r.closers, closeLedger)
	}
	r.setProbes(cfg)
	metrics, err := r.newMetrics(deps.Registry)
	if err != nil {
		return err
	}
	ledger := r.Ledger // as the replica's parts call it: every call timed when metrics are on
	if metrics != nil {
		ledger = pix.Timed(r.Ledger, metrics.ObserveLedger)
	}
	// The customers' routes call the ledger in their account's share of it; the desk and the
	// tier poller call it as it is.
	share, err := pix.NewShare(cfg.LedgerAccountShare, cfg.DBTimeout)
	if err != nil {
		return err
	}
	tiers := pix.NewTiers(ctx, ledger, logger, tierPoll)
	r.closers = append(r.closers, tiers.Close)
	r.freshTiers(tiers)
	r.Handler, err = httpapi.NewServer(httpapi.Deps{
		Metrics:                 metrics,
		Logger:                  logger,
		Limiter:                 r.Limiter,
		Stack:                   r.Stack,
		DenyCache:               r.DenyCache,
		Queue:                   r.Queue,
		Fallback:                r.Fallback,
		Releases:                r.Releases,
		Limits:                  cfg.Limits,
		OpenAPI:                 pixlimit.OpenAPI,
		Ledger:                  pix.Shared(ledger, share),
		Share:                   share,
		Tiers:                   tiers,
		LedgerRetryAfter:        cfg.DBTimeout,
		Tokens:                  r.Tokens,
		Passwords:               passwords,
		DeviceRegistrationDelay: cfg.DeviceRegistrationDelay,
		Devices:                 devices,
		TrustedProxies:          cfg.TrustedProxies,
		Probes:                  r.probes,
		Breaker:                 breakerOf(r.Breaker),
	})
	if err != nil || cfg.AdminAddr == "" {
		return err
	}
	return r.openDesk(cfg, ledger, tiers, secret, logger)
}

// openDesk builds the support desk (ADMIN_ADDR) over the replica's ledger, unshared: the desk's
// calls are not counted against any account's share.
func (r *Replica) openDesk(cfg config.Config, ledger pix.Ledger, tiers *pix.Tiers, secret []byte, logger *slog.Logger) error {
	admin, err := httpapi.NewAdmin(httpapi.AdminDeps{Logger: logger.With("listener", "admin"), Limiter: r.Limiter, Stack: r.Stack, DenyCache: r.DenyCache,
		Limits: cfg.Limits, Ledger: ledger, Tokens: r.Tokens, Token: cfg.AdminToken, Tiers: tiers,
		AuditKey: auth.DeriveKey(secret, "audit names")})
	if err != nil {
		return err
	}
	r.Admin = admin
	r.closers = append(r.closers, admin.Close) // closed before the ledger: its last summaries are written
	return nil
}

// newMetrics registers the replica's metrics in reg; nil when reg is (metrics off).
func (r *Replica) newMetrics(reg prometheus.Registerer) (*httpapi.Metrics, error) {
	if reg == nil {
		return nil, nil
	}
	// /readyz's probe, asked when scraped: an idle replica's gauge says what Redis is now. A
	// second at most, so a stall never costs the scrape its other metrics; like /readyz, an
	// answer closes an open breaker.
	probe := r.probes[0]
	redisUp := func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), min(probe.Timeout, time.Second))
		defer cancel()
		return probe.Ping(ctx) == nil
	}
	return httpapi.NewMetrics(reg, httpapi.LimiterGauges{RedisUp: redisUp, WithdrawalsLost: r.Withdrawals.Lost})
}

// setProbes sets /readyz's probes. A proxy routes on /readyz (deploy/haproxy.cfg checks it every
// second): a probe that waits out a long ledger deadline delays a lost replica's exit from the
// rotation by as much, so the database probe gets a second at most. A database that needs more
// is not ready.
func (r *Replica) setProbes(cfg config.Config) {
	ready := r.Limiter.Ready
	if r.Breaker != nil {
		ready = r.Breaker.Ready // asks Redis even while the breaker is open, and an answer closes it
	}
	r.probes = []httpapi.Probe{{Name: "redis", Timeout: cfg.RedisTimeout, Ping: ready}}
	if db, ok := r.Ledger.(*pix.PostgresLedger); ok {
		r.probes = append(r.probes, httpapi.Probe{Name: "database", Timeout: min(cfg.DBTimeout, time.Second), Ping: db.Ping})
	}
}

// tiersStale is how long a replica may go without reading the tier table before its /readyz
// says the database is down: the table holds the revocations, and a device revoked since would
// still get in on it. Many polls (tierPoll), so that a slow moment of the database is not an exit
// from the rotation.
const tiersStale = 20 * tierPoll

// freshTiers makes the database probe (setProbes) also fail while tiers has not been read within
// tiersStale: at start until the first read, and whenever the poller cannot read it, unless
// every connection of the pool is at work (the poller waits for one as the transfers do: busy,
// not down, as the probe's own ping answers then; the revocations are read once one is free).
func (r *Replica) freshTiers(tiers *pix.Tiers) {
	db, ok := r.Ledger.(*pix.PostgresLedger)
	if !ok {
		return
	}
	for i, p := range r.probes {
		if p.Name == "database" {
			ping := p.Ping
			r.probes[i].Ping = func(ctx context.Context) error {
				if err := ping(ctx); err != nil || db.Busy() {
					return err
				}
				return tiers.Fresh(tiersStale)
			}
		}
	}
}

// breakerOf is b as /readyz reads it: nil when there is none (not a nil *breaker.Breaker).
func breakerOf(b *breaker.Breaker) httpapi.Breaker {
	if b == nil {
		return nil
	}
	return b
}

// replicaSecret is AUTH_SECRET, or a random one for this process alone when it is empty (only
// with the embedded Redis: config refuses it with a shared one).
func replicaSecret(cfg config.Config, logger *slog.Logger) []byte {
	secret := []byte(cfg.AuthSecret)
	if len(secret) == 0 { // only with the embedded Redis: config refuses it with a shared one
		secret = []byte(rand.Text() + rand.Text())
		logger.Warn("AUTH_SECRET is empty: using a random secret for this process; its tokens and " +
			"rate-limit keys are not shared with other processes")
	}
	return secret
}

// startLimiter makes the replica's Limiter over rdb and warms it. The stack, from Redis up:
//
//	rdb                  the Redis client
//	breaker.New(rdb)     fails calls at once while Redis keeps failing (not on a cluster)
//	batch.New(…)         sends decisions in batches under load (not on a cluster)
//	withdraw.New(…)      takes back what a caller did not get (on a cluster, decides keys apart)
//	ratelimit.New(…)     the limiter: policies, keys, one script per decision
//	  sequence.New(rdb)  runs a request's several steps in one script (its Options.Sequences,
//	                     inside withdraw's Sequences: a lost reply's admissions are taken back)
//	denycache.New(…)     refuses a key known to be full from memory (unless off)
//	outages.New(…)       logs each policy's outage and its recovery
//	queue.New(…)         holds a queue's admissions until their turns: the Stack
//	fallback.New(…)      decides in memory while Redis cannot (beside the stack)
func (r *Replica) startLimiter(ctx context.Context, cfg config.Config, rdb redis.UniversalClient, secret []byte, logger *slog.Logger) error {
	opts := cfg.Limiter
	opts.KeySecret = auth.RateLimitKey(secret)
	var batches *batch.Runner
	runner := ratelimit.Scripts(rdb)
	_, cluster := rdb.(*redis.ClusterClient)
	// A cluster gets neither: one master's failure fails only its slots (a breaker would fail
	// them all), and one script touches one slot (a batch spans many).
	if !cluster {
		if cfg.Breaker.Failures > 0 {
			bo := cfg.Breaker
			bo.Logger = logger
			bo.Probe = func(ctx context.Context, rdb redis.Scripter) error { return ratelimit.Probe(ctx, rdb, opts.Prefix) }
			brk, err := breaker.New(rdb, bo)
			if err != nil {
				return err
			}
			r.Breaker, rdb = brk, brk
			r.closers = append(r.closers, func() { _ = brk.Close() })
		}
		runner = batch.New(rdb, ratelimit.Scripts(rdb), cfg.BatchMax)
		batches, _ = runner.(*batch.Runner)
	}
	r.Withdrawals = withdraw.New(rdb, runner, withdraw.Options{Split: cluster, Timeout: opts.Timeout, Logger: logger})
	r.closers = append(r.closers, func() { _ = r.Withdrawals.Close() }) // after the Limiter's: it decides no more
	opts.Runner = r.Withdrawals
	sequences := sequence.New(rdb)
	opts.Sequences = r.Withdrawals.Sequences(sequences)
	var err error
	if r.Limiter, err = ratelimit.New(rdb, opts); err != nil {
		return err
	}
	if cfg.DenyCacheSize > 0 {
		if r.DenyCache, err = denycache.New(r.Limiter, rdb, opts.Prefix, denycache.Options{Size: cfg.DenyCacheSize, Cluster: cluster, Timeout: cfg.RedisTimeout}); err != nil {
			return err
		}
		r.closers = append(r.closers, func() { _ = r.DenyCache.Close() })
	}
	r.Stack = r.Limiter
	if r.DenyCache != nil {
		r.Stack = r.DenyCache
	}
	r.Stack = outages.New(r.Stack, outages.Options{Logger: logger})
	qo := queue.Options{MaxWaiting: cfg.MaxWaiting, Prefix: opts.Prefix, Timeout: opts.Timeout}
	r.Queue = queue.New(r.Stack, rdb, qo)
	r.Stack = r.Queue
	r.closers = append(r.closers, func() { _ = r.Queue.Close() })
	r.Fallback = fallback.New(r.Limiter, rdb, r.Queue, fallback.Options{FleetSize: cfg.FleetSize, Prefix: opts.Prefix, Timeout: opts.Timeout})
	r.closers = append(r.closers, func() { _ = r.Fallback.Close() })
	r.Releases = slots.NewRetry(r.Stack, releasesWaiting)
	r.closers = append(r.closers, r.Releases.Close)
	// Before serving: the scripts loaded on every master, the slot map known, connections
	// dialed, so the first burst's decisions pay for none of it inside their budget.
	warmCtx, cancel := context.WithTimeout(ctx, warmTimeout)
	err = warm.Up(warmCtx, rdb, warmConns, append(sequences.Scripts(), slots.Script(), grants.Script())...)
	if batches != nil { // loaded even if a dial failed: a batch then pays no NOSCRIPT
		err = errors.Join(err, batches.Load(warmCtx))
	}
	if err != nil {
		logger.Warn("could not warm the rate limiter: its first decisions may fail by their fail modes", "err", err)
	}
	cancel()
	return nil
}

// Close releases what the replica opened, in reverse order. A ledger handed in Deps stays open.
func (r *Replica) Close() {
	for i := len(r.closers) - 1; i >= 0; i-- {
		r.closers[i]()
	}
	r.closers = nil
}

// openLedger opens the PostgreSQL ledger of DATABASE_URL, or an in-memory one when it is empty,
// with the demo accounts hashed at passwordCost when the configuration asks for them.
func openLedger(ctx context.Context, cfg config.Config, passwordCost int, logger *slog.Logger) (pix.Ledger, func(), error) {
	var accounts []pix.Account
	if cfg.DemoAccounts {
		var err error
		if accounts, err = pix.DemoAccounts(passwordCost); err != nil {
			return nil, nil, err
		}
	}
	if cfg.DatabaseURL == "" {
		if cfg.DemoAccounts { // the contract's default for an in-memory ledger: loud, as for PostgreSQL
			logger.Warn("seeding the demo accounts, whose passwords are published, into the in-memory ledger; " +
				"never serve real customers so (DEMO_ACCOUNTS=false)")
		}
		logger.Warn("DATABASE_URL is empty: the ledger is in this process's memory; balances are " +
			"lost on restart and not shared with other replicas, so set DATABASE_URL for a fleet")
		l, err := pix.NewMemoryLedger(accounts, pix.WithRules(cfg.Money))
		return l, func() {}, err
	}
	if cfg.DemoAccounts {
		logger.Warn("DEMO_ACCOUNTS=true: seeding the demo accounts, whose passwords are published, into " +
			"the PostgreSQL ledger; never do this in a real deployment")
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	l, err := pix.OpenPostgres(ctx, cfg.DatabaseURL, cfg.DBTimeout, accounts, pix.WithRules(cfg.Money),
		pix.WithTokenLifetime(max(cfg.TokenTTL, cfg.DeviceTTL)))
	if err != nil {
		return nil, nil, fmt.Errorf("open the ledger of DATABASE_URL: %w", err)
	}
	return l, l.Close, nil
}

// connectRedis returns a client tuned for the decision budget: of REDIS_URL, of the Redis
// Cluster of REDIS_CLUSTER_ADDRS, of the master REDIS_SENTINEL_* name, or of an embedded
// in-process Redis when none is set. go-redis follows MOVED/ASK redirections and sentinel
// failovers itself; while one is under way, decisions fail and the routes' fail modes answer.
func connectRedis(cfg config.Config, logger *slog.Logger) (redis.UniversalClient, func(), error) {
	switch {
	case len(cfg.Redis.Cluster) > 0:
		opt := &redis.UniversalOptions{Addrs: cfg.Redis.Cluster, IsClusterMode: true}
		ratelimit.UniversalClientOptions(opt, cfg.RedisTimeout)
		rdb := redis.NewUniversalClient(opt)
		return rdb, func() { _ = rdb.Close() }, nil
	case len(cfg.Redis.Sentinel) > 0:
		opt := &redis.UniversalOptions{Addrs: cfg.Redis.Sentinel, MasterName: cfg.Redis.SentinelMaster}
		ratelimit.UniversalClientOptions(opt, cfg.RedisTimeout)
		rdb := redis.NewUniversalClient(opt)
		return rdb, func() { _ = rdb.Close() }, nil
	}
	opt := cfg.Redis.URL
	stop := func() {}
	if opt == nil {
		mr, err := memredis.Start()
		if err != nil {
			return nil, nil, err
		}
		logger.Warn("REDIS_URL is empty: using an embedded in-process Redis; limits hold for this " +
			"replica only, so set REDIS_URL for a fleet")
		opt = &redis.Options{Addr: mr.Addr()}
		stop = mr.Close
	} else {
		opt = new(*opt) // the configuration's own stays as parsed
	}
	ratelimit.ClientOptions(opt, cfg.RedisTimeout)
	rdb := redis.NewClient(opt)
	return rdb, func() { _ = rdb.Close(); stop() }, nil
}
