package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/pixlimit/pixlimit/internal/app"
	"github.com/pixlimit/pixlimit/internal/auth"
	"github.com/pixlimit/pixlimit/internal/config"
	"github.com/pixlimit/pixlimit/internal/ratelimit"
)

// shutdownGrace is how long a stopping server waits for in-flight requests: the longest answer,
// a queued PIX's wait and transfer included (config.WriteTimeout), so that every request accepted
// is answered. With the desk's last summaries (httpapi.DeskCloseTimeout) and the replica's
// closing, it fits compose's stop grace (25 s), so a stop ends before the SIGKILL, not by it.
const shutdownGrace = config.WriteTimeout

// run is the API program: it loads the configuration from environ (os.Environ), warns of any
// variable with one of its prefixes that it does not know and of any set under a deprecated
// name, connects to Redis (or starts an embedded one) and the ledger, serves until ctx is done,
// then drains in-flight requests and returns nil. A configuration error names every offending
// variable and returns before anything listens. Logs go to stderr.
//
// "api healthcheck" instead asks the local server's /healthz and returns an error unless it
// answers 200: a container HEALTHCHECK for images without curl.
func run(ctx context.Context, args []string, environ []string, stdout, stderr io.Writer) error {
	return runReplica(ctx, args, environ, stdout, stderr, auth.DefaultPasswordCost)
}

// runReplica is run with the passwords hashed at passwordCost (app.Deps.PasswordCost): the
// program's is a real deployment's, and the tests' is bcrypt's least.
func runReplica(ctx context.Context, args []string, environ []string, stdout, stderr io.Writer, passwordCost int) error {
	healthcheck := len(args) == 2 && args[1] == "healthcheck"
	if len(args) > 1 && !healthcheck {
		return fmt.Errorf("unexpected arguments %q: the API is configured through its environment", args[1:])
	}
	cfg, err := config.Load(config.Environ(environ))
	if err != nil {
		return err
	}
	if healthcheck {
		return checkHealth(ctx, cfg.HTTPAddr)
	}
	logger := newLogger(cfg, stderr)
	warnVariables(logger, cfg, environ)

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	replica, err := app.New(ctx, cfg, app.Deps{Logger: logger, Registry: reg, PasswordCost: passwordCost})
	if err != nil {
		return err
	}
	defer replica.Close()
	most := cfg.MaxConnections
	if files, ok := openFilesLimit(); ok {
		if most = publicConnections(cfg.MaxConnections, files); most < cfg.MaxConnections {
			logger.Warn("HTTP_MAX_CONNECTIONS is more than this process may open files for: the public listener holds fewer; raise the limit (ulimit -n) to hold more",
				"HTTP_MAX_CONNECTIONS", cfg.MaxConnections, "open_files_limit", files, "held", most)
		}
	}
	ln, err := listen(cfg.HTTPAddr, most, 0) // the proxy is one peer: no bound per peer
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
	stopAdmin := func(context.Context) {}
	if cfg.AdminAddr != "" {
		if stopAdmin, err = serveAdmin(cfg.AdminAddr, replica.Admin, logger); err != nil {
			ln.Close()
			return err
		}
		done, cancel := context.WithCancel(context.Background())
		cancel()
		defer stopAdmin(done) // at once (a run that failed); after a drain, a no-op
	}
	srv := httpServer(replica.Handler, config.WriteTimeout, logger) // config.Load refuses timeouts whose longest answer would not fit
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
	var desk sync.WaitGroup
	desk.Go(func() { stopAdmin(shutdownCtx) }) // the desk's calls drain beside the public ones
	err = srv.Shutdown(shutdownCtx)
	desk.Wait()
	if err != nil {
		_ = srv.Close() // cancels what is left (its handlers end within their budgets) as the replica closes
		return fmt.Errorf("shutdown: %w", err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	logger.Info("stopped")
	return nil
}

// warnVariables warns of the variables environ sets that the configuration ignores (misspelled)
// or reads under a deprecated name, and of the money rules set apart from the central bank's.
func warnVariables(logger *slog.Logger, cfg config.Config, environ []string) {
	for _, name := range config.Unknown(environ) {
		logger.Warn("a variable with a prefix of the configuration's is not one of its variables: misspelled? it is ignored", "variable", name)
	}
	for _, d := range cfg.Deprecated {
		msg := "a variable is set under its deprecated name, read while the new one is unset: rename it"
		if d.Ignored {
			msg = "a variable is set under its deprecated name and its new one: the new one wins; remove the deprecated one"
		}
		logger.Warn(msg, "variable", d.Old, "use", d.New)
	}
	for _, rule := range cfg.MoneyOffRules {
		logger.Warn("a money rule is set apart from the central bank's: fine for a test or a demo, not for a real bank", "rule", rule)
	}
}

// httpServer is every listener's server: the public API's, the desk's and the metrics'. Each of
// its waits has a deadline, so that no client holds a connection (a file descriptor the public
// API needs) by sending slowly or by keeping it idle: its headers within 5 s, its request within
// 10 s, its answer written within write, and an idle connection closed after a minute. A
// request's headers are 16 KiB at most (431 past it; HAProxy's own bound): Go's default, a
// megabyte, let each connection pin a megabyte for those 5 s.
func httpServer(h http.Handler, write time.Duration, logger *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      write,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    12 << 10, // and the 4 KiB net/http reads on top
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
}

// listen is every listener's: at most most connections open at once (HTTP_MAX_CONNECTIONS for the
// public one). Idle connections cost a goroutine, buffers and a file descriptor each, and no
// client may take every descriptor the replica's Redis and database connections need: 20,000
// idle ones did, in a resources audit. One accepted past the bound is closed at once, rather than
// left in the kernel's backlog: its client (or the proxy, for a GET) learns it now and goes
// elsewhere, instead of waiting out its timeout.
func listen(addr string, most, perPeer int) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	return &bounded{Listener: ln, open: make(chan struct{}, most), perPeer: perPeer, peers: map[netip.Addr]int{}}, nil
}

// bounded is listen's listener: open holds a place per connection open; peers counts each peer
// address's, when perPeer bounds them (0: not).
type bounded struct {
	net.Listener
	open    chan struct{}
	perPeer int
	mu      sync.Mutex
	peers   map[netip.Addr]int
}

func (l *bounded) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		peer := peerOf(c)
		if !l.enter(peer) {
			_ = c.Close() // past its peer's bound
			continue
		}
		select {
		case l.open <- struct{}{}:
			return &placed{Conn: c, leave: func() { <-l.open; l.leave(peer) }}, nil
		default:
			l.leave(peer)
			_ = c.Close() // past the bound
		}
	}
}

// enter counts a connection of peer, unless it holds perPeer already.
func (l *bounded) enter(peer netip.Addr) bool {
	if l.perPeer <= 0 {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.peers[peer] >= l.perPeer {
		return false
	}
	l.peers[peer]++
	return true
}

func (l *bounded) leave(peer netip.Addr) {
	if l.perPeer <= 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.peers[peer]--; l.peers[peer] <= 0 {
		delete(l.peers, peer)
	}
}

// peerOf is c's peer as the bound per peer counts it: an IPv4 address, or an IPv6 address's /64,
// whose addresses one subscriber picks at will (ratelimit.IPIdentity); the zero Addr for another
// kind of connection.
func peerOf(c net.Conn) netip.Addr {
	a, ok := c.RemoteAddr().(*net.TCPAddr)
	if !ok {
		return netip.Addr{}
	}
	addr := ratelimit.Unmap(a.AddrPort().Addr())
	if addr.Is6() {
		p, _ := addr.Prefix(64)
		return p.Addr()
	}
	return addr
}

// placed is a connection holding its place until it is closed (once, however often Close is called).
type placed struct {
	net.Conn
	once  sync.Once
	leave func()
}

func (c *placed) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.leave)
	return err
}

// sideConnections bounds the desk's and the metrics' listeners: a few operators and scrapers;
// sidePeerConnections, one address's connections there, so that one client holding its
// connections idle does not lock the support team out of the desk.
const (
	sideConnections     = 64
	sidePeerConnections = 16
)

// ownFiles are the descriptors a replica keeps for itself beside its public connections: the
// desk's and the metrics' connections, and a fixed 1,024 for the rest (Redis's pools, go-redis's
// default 10 a core; the database's, pgxpool's default 4 or a core each; its listeners and
// files). A deployment with larger pools raises the limit or lowers HTTP_MAX_CONNECTIONS.
const ownFiles = 2*sideConnections + 1024

// publicConnections is how many connections the public listener holds: want (HTTP_MAX_CONNECTIONS,
// at least 1), or fewer where the process may open only openFiles descriptors. A bound past them
// would keep none for Redis and the database (accept would fail for everyone first, /readyz
// too), so it leaves ownFiles, or half of a limit too small for that.
func publicConnections(want int, openFiles uint64) int {
	left := openFiles - min(ownFiles, openFiles/2)
	if want > 0 && left < uint64(want) {
		return max(int(left), 1)
	}
	return want
}

// serveAdmin serves the support desk on its own listener (ADMIN_ADDR), never the public one. stop
// drains its calls until ctx ends, then closes what is left.
func serveAdmin(addr string, h http.Handler, logger *slog.Logger) (stop func(context.Context), err error) {
	ln, err := listen(addr, sideConnections, sidePeerConnections)
	if err != nil {
		return nil, fmt.Errorf("admin listen: %w", err)
	}
	srv := httpServer(h, 15*time.Second, logger)
	go func() { _ = srv.Serve(ln) }()
	logger.Info("support desk listening", "addr", ln.Addr().String())
	return func(ctx context.Context) {
		if srv.Shutdown(ctx) != nil {
			_ = srv.Close()
		}
	}, nil
}

// serveMetrics serves reg's metrics in the Prometheus text format on their own listener, never
// through the public door; stop closes it.
func serveMetrics(addr string, reg *prometheus.Registry, logger *slog.Logger) (stop func(), err error) {
	ln, err := listen(addr, sideConnections, sidePeerConnections)
	if err != nil {
		return nil, fmt.Errorf("metrics listen: %w", err)
	}
	mux := http.NewServeMux()
	// A scrape asks Redis (pixlimit_ratelimit_redis_up): a few at once, the rest answered 503.
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg, MaxRequestsInFlight: 4}))
	srv := httpServer(mux, 15*time.Second, logger)
	go func() { _ = srv.Serve(ln) }()
	logger.Info("metrics", "addr", ln.Addr().String())
	return func() { _ = srv.Close() }, nil
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

// newLogger returns the process's logger per LOG_LEVEL and LOG_FORMAT.
func newLogger(cfg config.Config, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: cfg.LogLevel}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
