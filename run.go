package pixlimit

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/pixlimit/pixlimit/internal/auth"
	"github.com/pixlimit/pixlimit/internal/config"
	"github.com/pixlimit/pixlimit/internal/pix"
	"github.com/pixlimit/pixlimit/internal/ratelimit"
)

// shutdownGrace is how long a stopping server waits for in-flight requests.
const shutdownGrace = 10 * time.Second

// Run is the API program: it loads the configuration through getenv, connects to Redis (or
// starts an embedded one), serves until ctx is done, then drains in-flight requests and returns
// nil. A configuration error names every offending variable and returns before anything
// listens. Logs go to stderr.
//
// "api healthcheck" instead asks the local server's /healthz and returns an error unless it
// answers 200: a container HEALTHCHECK for images without curl.
func Run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	healthcheck := len(args) == 2 && args[1] == "healthcheck"
	if len(args) > 1 && !healthcheck {
		return fmt.Errorf("unexpected arguments %q: the API is configured through its environment", args[1:])
	}
	cfg, err := config.Load(getenv)
	if err != nil {
		return err
	}
	if healthcheck {
		return checkHealth(ctx, cfg.HTTPAddr)
	}
	logger := NewLogger(cfg, stderr)

	rdb, closeRedis, err := connectRedis(cfg, logger)
	if err != nil {
		return err
	}
	defer closeRedis()

	secret := []byte(cfg.AuthSecret)
	if len(secret) == 0 {
		secret = []byte(rand.Text() + rand.Text())
		logger.Warn("AUTH_SECRET is empty: using a random secret for this process; its tokens and " +
			"rate-limit keys are not shared with other replicas, so set AUTH_SECRET for a fleet")
	}
	ledger, closeLedger, err := openLedger(ctx, cfg, logger)
	if err != nil {
		return err
	}
	defer closeLedger()
	deps, err := NewDeps(cfg, logger, rdb, secret, ledger)
	if err != nil {
		return err
	}
	if db, ok := ledger.(*pix.PostgresLedger); ok {
		deps.Database = db
	}
	handler, err := NewServer(deps)
	if err != nil {
		return err
	}

	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	srv := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      15 * time.Second,
		IdleTimeout:       60 * time.Second,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	logger.Info("listening", "addr", ln.Addr().String(), "redis_timeout", cfg.RedisTimeout.String())

	select {
	case err := <-served:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	logger.Info("shutting down: draining in-flight requests")
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownGrace)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	logger.Info("stopped")
	return nil
}

// NewDeps builds a replica's dependencies over one Redis client, one token secret and one
// ledger; replicas that share all three form one fleet.
func NewDeps(cfg config.Config, logger *slog.Logger, rdb redis.UniversalClient, secret []byte, ledger pix.Ledger) (Deps, error) {
	quietRedis.Do(func() { redis.SetLogger(redisLogger{logger}) }) // go-redis logs each failed dial
	tokens, err := auth.NewTokens(secret, cfg.TokenTTL)
	if err != nil {
		return Deps{}, err
	}
	limiter, err := ratelimit.New(rdb, ratelimit.Options{
		KeySecret:            keySecret(secret),
		Timeout:              cfg.RedisTimeout,
		FailClosedRetryAfter: cfg.FailClosedRetryAfter,
		Logger:               logger,
	})
	if err != nil {
		return Deps{}, err
	}
	return Deps{Logger: logger, Config: cfg, Limiter: limiter, Ledger: ledger, Tokens: tokens, Redis: rdb}, nil
}

// checkHealth asks the server listening on addr (":8080" means this host) for /healthz.
func checkHealth(ctx context.Context, addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+net.JoinHostPort(host, port)+"/healthz", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("healthcheck: /healthz answered %d", resp.StatusCode)
	}
	return nil
}

// openLedger opens the PostgreSQL ledger of DATABASE_URL, or an in-memory one when it is empty.
func openLedger(ctx context.Context, cfg config.Config, logger *slog.Logger) (pix.Ledger, func(), error) {
	var accounts []pix.Account
	if cfg.DemoAccounts {
		accounts = pix.DemoAccounts()
	}
	if cfg.DatabaseURL == "" {
		if cfg.DemoAccounts {
			logger.Info("seeding the demo accounts into the in-memory ledger")
		}
		logger.Warn("DATABASE_URL is empty: the ledger is in this process's memory; balances are " +
			"lost on restart and not shared with other replicas, so set DATABASE_URL for a fleet")
		l, err := pix.NewMemoryLedger(accounts)
		return l, func() {}, err
	}
	if cfg.DemoAccounts {
		logger.Warn("DEMO_ACCOUNTS=true: seeding the demo accounts, whose passwords are published, into " +
			"the PostgreSQL ledger; never do this in a real deployment")
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	l, err := pix.OpenPostgres(ctx, cfg.DatabaseURL, cfg.DBTimeout, accounts)
	if err != nil {
		return nil, nil, err
	}
	return l, l.Close, nil
}

// keySecret derives the rate limiter's key-hashing secret from the token secret, so one
// variable configures both and neither secret can be computed from the other's use.
func keySecret(secret []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("pixlimit ratelimit keys v1"))
	return m.Sum(nil)
}

// connectRedis returns a client tuned for the decision budget: of REDIS_URL, of the Redis
// Cluster of REDIS_CLUSTER_ADDRS, of the master REDIS_SENTINEL_* name, or of an embedded
// in-process Redis when none is set. go-redis follows MOVED/ASK redirections and sentinel
// failovers itself; while one is under way, decisions fail and the routes' fail modes answer.
func connectRedis(cfg config.Config, logger *slog.Logger) (redis.UniversalClient, func(), error) {
	switch {
	case len(cfg.RedisCluster) > 0:
		opt := &redis.UniversalOptions{Addrs: cfg.RedisCluster, IsClusterMode: true}
		ratelimit.UniversalClientOptions(opt, cfg.RedisTimeout)
		rdb := redis.NewUniversalClient(opt)
		return rdb, func() { _ = rdb.Close() }, nil
	case len(cfg.RedisSentinel) > 0:
		opt := &redis.UniversalOptions{Addrs: cfg.RedisSentinel, MasterName: cfg.RedisSentinelMaster}
		ratelimit.UniversalClientOptions(opt, cfg.RedisTimeout)
		rdb := redis.NewUniversalClient(opt)
		return rdb, func() { _ = rdb.Close() }, nil
	}
	opt := cfg.Redis
	stop := func() {}
	if opt == nil {
		mr, err := StartEmbeddedRedis()
		if err != nil {
			return nil, nil, err
		}
		logger.Warn("REDIS_URL is empty: using an embedded in-process Redis; limits hold for this " +
			"replica only, so set REDIS_URL for a fleet")
		opt = &redis.Options{Addr: mr.Addr()}
		stop = mr.Shutdown
	}
	ratelimit.ClientOptions(opt, cfg.RedisTimeout)
	rdb := redis.NewClient(opt)
	return rdb, func() { _ = rdb.Close(); stop() }, nil
}

// EmbeddedRedis is an in-process Redis (miniredis) on a loopback port: the zero-setup default
// for one replica and for the demo. Close stops it; Restart brings it back on the same address.
type EmbeddedRedis struct {
	*miniredis.Miniredis
}

// StartEmbeddedRedis starts an EmbeddedRedis whose keys expire when the clock says so.
//
// miniredis only expires keys when told that time has passed. Telling it from a ticker, by whole
// ticks, expires a key set just before a tick up to a tick early: a sliding log could then forget
// admissions still inside its window and admit before the Retry-After it announced. ClockTTL
// instead advances every TTL by the clock time elapsed, exactly, on each command, so a key
// expires at the first command after its deadline, never before; scripts decide by time, so
// expiring late changes no decision.
func StartEmbeddedRedis() (*EmbeddedRedis, error) {
	mr := miniredis.NewMiniRedis()
	mr.ClockTTL(true)
	if err := mr.Start(); err != nil {
		return nil, fmt.Errorf("embedded redis: %w", err)
	}
	return &EmbeddedRedis{Miniredis: mr}, nil
}

// Shutdown stops the server for good.
func (e *EmbeddedRedis) Shutdown() { e.Close() }

// NewLogger returns the process's logger per LOG_LEVEL and LOG_FORMAT.
func NewLogger(cfg config.Config, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: cfg.LogLevel}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

var quietRedis sync.Once

// redisLogger sends go-redis's internal messages to slog at debug level: the limiter already
// reports outages, throttled, at error level.
type redisLogger struct{ l *slog.Logger }

func (r redisLogger) Printf(ctx context.Context, format string, v ...any) {
	r.l.DebugContext(ctx, fmt.Sprintf(format, v...), "component", "go-redis")
}
