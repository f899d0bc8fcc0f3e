package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/pixlimit/pixlimit/internal/auth"
	"github.com/pixlimit/pixlimit/internal/config"
	"github.com/pixlimit/pixlimit/internal/httpapi"
	"github.com/pixlimit/pixlimit/internal/memredis"
	"github.com/pixlimit/pixlimit/internal/pix"
	"github.com/pixlimit/pixlimit/internal/ratelimit"
)

// warmTimeout bounds the limiter's warm-up at start, and warmConns is how many connections it
// dials to each Redis master: a burst of about that many decisions finds them open.
const (
	warmTimeout = 5 * time.Second
	warmConns   = 16
)

// shutdownGrace is how long a stopping server waits for in-flight requests: shorter than
// Docker's stop timeout (10 s), so a drain ends before the SIGKILL, not by it.
const shutdownGrace = 8 * time.Second

// run is the API program: it loads the configuration through lookupEnv (os.LookupEnv), connects to Redis (or
// starts an embedded one) and the ledger, serves until ctx is done, then drains in-flight
// requests and returns nil. A configuration error names every offending variable and returns
// before anything listens. Logs go to stderr.
//
// "api healthcheck" instead asks the local server's /healthz and returns an error unless it
// answers 200: a container HEALTHCHECK for images without curl.
func run(ctx context.Context, args []string, lookupEnv func(string) (string, bool), stdout, stderr io.Writer) error {
	healthcheck := len(args) == 2 && args[1] == "healthcheck"
	if len(args) > 1 && !healthcheck {
		return fmt.Errorf("unexpected arguments %q: the API is configured through its environment", args[1:])
	}
	cfg, err := config.Load(lookupEnv)
	if err != nil {
		return err
	}
	if healthcheck {
		return checkHealth(ctx, cfg.HTTPAddr)
	}
	logger := newLogger(cfg, stderr)

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	handler, closeAll, err := wire(ctx, cfg, logger, reg)
	if err != nil {
		return err
	}
	defer closeAll()
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	if cfg.MetricsAddr != "" {
		stop, err := serveMetrics(cfg.MetricsAddr, reg, logger)
		if err != nil {
			ln.Close()
			return err
		}
		defer stop()
	}
	srv := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      config.WriteTimeout, // config.Load refuses timeouts whose longest answer would not fit
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

// serveMetrics serves reg's metrics in the Prometheus text format on their own listener, never
// through the public door; stop closes it.
func serveMetrics(addr string, reg *prometheus.Registry, logger *slog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics listen: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, WriteTimeout: 15 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	logger.Info("metrics", "addr", ln.Addr().String())
	return func() { _ = srv.Close() }, nil
}

// wire builds the server from the configuration: Redis and the limiter, the ledger, the token
// secret, its metrics in reg, and the handler over them. closeAll releases them in reverse order;
// on an error, wire has released what it built, and the error says what failed.
func wire(ctx context.Context, cfg config.Config, logger *slog.Logger, reg prometheus.Registerer) (http.Handler, func(), error) {
	var closers []func()
	closeAll := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	h, err := build(ctx, cfg, logger, reg, &closers)
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	return h, closeAll, nil
}

// build is wire's body: each thing it opens appends its closer to closers as soon as it exists.
func build(ctx context.Context, cfg config.Config, logger *slog.Logger, reg prometheus.Registerer, closers *[]func()) (http.Handler, error) {
	rdb, closeRedis, err := connectRedis(cfg, logger)
	if err != nil {
		return nil, err
	}
	*closers = append(*closers, closeRedis)
	secret := []byte(cfg.AuthSecret)
	if len(secret) == 0 { // only with the embedded Redis: config refuses it with a shared one
		secret = []byte(rand.Text() + rand.Text())
		logger.Warn("AUTH_SECRET is empty: using a random secret for this process; its tokens and " +
			"rate-limit keys are not shared with other processes")
	}
	opts := cfg.LimiterOptions()
	opts.KeySecret, opts.Logger = auth.RateLimitKey(secret), logger
	limiter, err := ratelimit.New(rdb, opts)
	if err != nil {
		return nil, err
	}
	*closers = append(*closers, func() { _ = limiter.Close() }) // waits for withdrawals, before Redis closes
	// Before listening: the scripts loaded on every master, the slot map known, connections
	// dialed, so the first burst's decisions pay for none of it inside their budget.
	warmCtx, cancel := context.WithTimeout(ctx, warmTimeout)
	if err := limiter.Warm(warmCtx, warmConns); err != nil {
		logger.Warn("could not warm the rate limiter: its first decisions may fail by their fail modes", "err", err)
	}
	cancel()
	tokens, devices, err := issuers(cfg, secret)
	if err != nil {
		return nil, err
	}
	ledger, closeLedger, err := openLedger(ctx, cfg, logger)
	if err != nil {
		return nil, err
	}
	*closers = append(*closers, closeLedger)

	// A proxy routes on /readyz (deploy/haproxy.cfg checks it every second): a probe that waits
	// out a long ledger deadline delays a lost replica's exit from the rotation by as much, so
	// the database probe gets a second at most. A database that needs more is not ready.
	probes := []httpapi.Probe{{Name: "redis", Timeout: cfg.RedisTimeout, Ping: limiter.Ready}}
	if db, ok := ledger.(*pix.PostgresLedger); ok {
		probes = append(probes, httpapi.Probe{Name: "database", Timeout: min(cfg.DBTimeout, time.Second), Ping: db.Ping})
	}
	metrics, err := httpapi.NewMetrics(reg, limiter.RedisUp)
	if err != nil {
		return nil, err
	}
	return httpapi.NewServer(httpapi.Deps{
		Metrics:          metrics,
		Logger:           logger,
		Limiter:          limiter,
		Limits:           httpapi.Limits(cfg.Limits),
		Ledger:           ledger,
		LedgerRetryAfter: cfg.DBTimeout,
		Tokens:           tokens,
		Devices:          devices,
		TrustedProxies:   cfg.TrustedProxies,
		Probes:           probes,
	})
}

// issuers are the access tokens and the device tokens, both keyed by the secret.
func issuers(cfg config.Config, secret []byte) (*auth.Tokens, *auth.Devices, error) {
	tokens, err := auth.NewTokens(secret, cfg.TokenTTL)
	if err != nil {
		return nil, nil, err
	}
	devices, err := auth.NewDevices(secret, cfg.DeviceTTL)
	return tokens, devices, err
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
		l, err := pix.NewMemoryLedger(accounts, pix.WithNightCap(cfg.Night))
		return l, func() {}, err
	}
	if cfg.DemoAccounts {
		logger.Warn("DEMO_ACCOUNTS=true: seeding the demo accounts, whose passwords are published, into " +
			"the PostgreSQL ledger; never do this in a real deployment")
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	l, err := pix.OpenPostgres(ctx, cfg.DatabaseURL, cfg.DBTimeout, accounts, pix.WithNightCap(cfg.Night))
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
		mr, err := memredis.Start()
		if err != nil {
			return nil, nil, err
		}
		logger.Warn("REDIS_URL is empty: using an embedded in-process Redis; limits hold for this " +
			"replica only, so set REDIS_URL for a fleet")
		opt = &redis.Options{Addr: mr.Addr()}
		stop = mr.Close
	}
	ratelimit.ClientOptions(opt, cfg.RedisTimeout)
	rdb := redis.NewClient(opt)
	return rdb, func() { _ = rdb.Close(); stop() }, nil
}

// newLogger returns the process's logger per LOG_LEVEL and LOG_FORMAT.
func newLogger(cfg config.Config, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: cfg.LogLevel}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
