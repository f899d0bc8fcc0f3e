package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pixlimit/pixlimit/internal/app"
	"github.com/pixlimit/pixlimit/internal/auth"
	"github.com/pixlimit/pixlimit/internal/config"
	"github.com/pixlimit/pixlimit/internal/memredis"
	"github.com/pixlimit/pixlimit/internal/pix"
	"github.com/pixlimit/pixlimit/internal/ratelimit"
	"github.com/pixlimit/pixlimit/internal/ratelimit/breaker"
	"github.com/pixlimit/pixlimit/internal/ratelimit/denycache"
)

// demoEnv is the configuration of the in-process replicas: the contract's limits over short
// windows, so a whole run takes seconds (the login's is longer: no story waits for it, and the
// attack's steps must all fall inside one window on a busy machine), and loopback trusted as
// the proxy, so the demo can play many client IPs through X-Forwarded-For.
var demoEnv = map[string]string{
	"PIX_WINDOW":               "5s",
	"STATEMENT_WINDOW":         "5s",
	"LOGIN_WINDOW":             "2m",
	"TRUSTED_PROXIES":          "127.0.0.1/32,::1/128",
	"REDIS_TIMEOUT":            "2s", // generous: the embedded Redis runs Lua in Go in this process, which a busy machine (four CPU burners beside the tests) slows
	"FAIL_CLOSED_RETRY_AFTER":  "2s",
	"LOOKUP_REFILL_PER_MINUTE": "2",
	// No in-flight limit in the in-process fleet: its embedded Redis runs Lua in Go, and the slot's
	// steps made a busy machine's bursts miss REDIS_TIMEOUT; the stories show the rate limit and
	// the queue, the tests the in-flight limit (throttle_test.go). Against a target with the
	// default 2, the burst story sends the in-flight refusals again (burst).
	"PIX_CONCURRENCY": "0",
	// A small bank's DICT category (G: 250, refilled 25 a minute), so the scan story's cost to
	// the bank's bucket shows before the refill covers it.
	"LOOKUP_PARTICIPANT_CATEGORY": "G",
}

// nightAroundNow sets the night-time cap's window around the present hour in São Paulo, so the
// night story plays whenever the demo runs.
func nightAroundNow(env map[string]string) map[string]string {
	out := maps.Clone(env)
	if sp, err := time.LoadLocation("America/Sao_Paulo"); err == nil {
		now := time.Now().In(sp)
		out["NIGHT_START"], out["NIGHT_END"] = now.Add(-time.Hour).Format("15:04"), now.Add(time.Hour).Format("15:04")
	}
	return out
}

// fleet is two API replicas in this process over one Redis and one ledger.
type fleet struct {
	cfg      config.Config
	urls     []string
	desks    []string        // each replica's support desk
	redis    *embeddedOutage // nil when the fleet uses an outside Redis
	servers  []*http.Server
	replicas []*app.Replica
	limiters []*ratelimit.Limiter
	breakers []*breaker.Breaker // each replica's, nil when it has none
	caches   []*denycache.Cache // each replica's deny cache, nil when it has none
}

// startFleet starts two replicas configured by env, over the Redis at redisAddr, or over an
// embedded one when redisAddr is empty. Each is built by app.New, as cmd/api builds its one:
// its own Redis client and Limiter, over the fleet's shared ledger and token secret, with
// passwords hashed at passwordCost (0: a real deployment's).
func startFleet(logs io.Writer, env map[string]string, redisAddr string, passwordCost int) (f *fleet, err error) {
	f = &fleet{}
	defer func() {
		if err != nil {
			f.close()
		}
	}()
	if redisAddr == "" {
		mr, err := memredis.Start()
		if err != nil {
			return nil, err
		}
		f.redis, redisAddr = &embeddedOutage{mr}, mr.Addr()
	}
	env = maps.Clone(env)
	env["REDIS_URL"] = "redis://" + redisAddr
	env["AUTH_SECRET"] = rand.Text() + rand.Text() // shared by both replicas, as in a fleet
	// Each replica's support desk, on a listener of its own (the support story uses the first).
	env["ADMIN_ADDR"], env["ADMIN_TOKEN"] = "127.0.0.1:0", rand.Text()+rand.Text()
	if f.cfg, err = config.Load(config.Map(env)); err != nil {
		return nil, err
	}
	cost := cmp.Or(passwordCost, auth.DefaultPasswordCost)
	accounts, err := pix.DemoAccounts(cost)
	if err != nil {
		return nil, err
	}
	ledger, err := pix.NewMemoryLedger(accounts, pix.WithRules(f.cfg.Money))
	if err != nil {
		return nil, err
	}
	for i := range 2 {
		logger := slog.New(slog.NewTextHandler(logs, nil)).With("replica", i+1)
		r, err := app.New(context.Background(), f.cfg, app.Deps{Logger: logger, Ledger: ledger, PasswordCost: cost})
		if err != nil {
			return nil, err
		}
		f.replicas = append(f.replicas, r)
		f.limiters = append(f.limiters, r.Limiter)
		f.breakers = append(f.breakers, r.Breaker)
		f.caches = append(f.caches, r.DenyCache)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		srv := &http.Server{Handler: r.Handler, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		f.servers = append(f.servers, srv)
		f.urls = append(f.urls, "http://"+ln.Addr().String())
		if r.Admin != nil {
			aln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				return nil, err
			}
			asrv := &http.Server{Handler: r.Admin, ReadHeaderTimeout: 5 * time.Second}
			go func() { _ = asrv.Serve(aln) }()
			f.servers = append(f.servers, asrv)
			f.desks = append(f.desks, "http://"+aln.Addr().String())
		}
	}
	return f, nil
}

func (f *fleet) describe() string {
	c := f.cfg
	return fmt.Sprintf(`pixlimit demo: two API replicas in this process (%s) share one embedded Redis and one ledger;
requests alternate between them, so every limit you see holds across the fleet.
Short windows keep the run brief: PIX %d per %v, statement %d per %v, login %d per IP and %d per document per %v.
Both replicas trust loopback as their proxy, so the demo plays many client IPs with X-Forwarded-For
(a real deployment trusts only its own proxy's address).`,
		strings.Join(f.urls, ", "), c.Limits.PIX.Policy.Limit, c.Limits.PIX.Policy.Window, c.Limits.Statement.Policy.Limit, c.Limits.Statement.Policy.Window,
		c.Limits.LoginIP.Policy.Limit, c.Limits.LoginAccount.Policy.Limit, c.Limits.LoginIP.Policy.Window)
}

func (f *fleet) close() {
	for _, s := range f.servers {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = s.Shutdown(ctx)
		cancel()
	}
	for _, r := range f.replicas {
		r.Close() // its limiter waits for withdrawals in flight, before its client closes
	}
	if f.redis != nil {
		f.redis.mr.Close()
	}
}

// embeddedOutage stops the embedded Redis and brings it back on the same address, data intact.
type embeddedOutage struct{ mr *memredis.Server }

func (e *embeddedOutage) stop(context.Context) (string, error) {
	e.mr.Close()
	return "the embedded Redis stops: every connection to it is refused", nil
}

func (e *embeddedOutage) resume(context.Context) (string, error) {
	if err := e.mr.Restart(); err != nil {
		return "", err
	}
	return "the embedded Redis is back on the same address; the replicas were not restarted", nil
}

// redisControl reaches a deployment's Redis to pause it and to clear old limiter state.
type redisControl struct {
	rdb   *redis.Client
	until time.Time // when the current pause ends
}

// pauseFor is how long the outage lasts. CLIENT PAUSE ALL holds every client, the one that
// paused included, so even CLIENT UNPAUSE would wait: the pause is timed and ends by itself.
const pauseFor = 4 * time.Second

// newRedisControl connects to the lab's Redis at url, which must be on this machine: the demo
// deletes its rate-limit keys and pauses it, what no one does to a Redis others use
// (docker-compose.lab.yml publishes the fleet's on 127.0.0.1:6380).
func newRedisControl(ctx context.Context, url string) (*redisControl, error) {
	opt, err := redis.ParseURL(url)
	if err != nil { // the parser's words are not repeated: they can quote the password
		return nil, errors.New("-redis: not a redis://host:port URL (a password with / ? # or @ is percent-encoded)")
	}
	if opt.Network != "unix" && !onThisMachine(opt.Addr) {
		return nil, fmt.Errorf("-redis %s: not on this machine; the demo clears and pauses the Redis it is given, a lab's only "+
			"(docker-compose.lab.yml publishes the fleet's on 127.0.0.1:6380)", opt.Addr)
	}
	rdb := redis.NewClient(opt)
	if err := rdb.Ping(ctx).Err(); err != nil {
		_ = rdb.Close()
		return nil, fmt.Errorf("-redis %s: %w", opt.Addr, err)
	}
	return &redisControl{rdb: rdb}, nil
}

// onThisMachine says whether addr (host:port) is a loopback address, or localhost.
func onThisMachine(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

func (r *redisControl) close() { _ = r.rdb.Close() }

func (r *redisControl) stop(ctx context.Context) (string, error) {
	if err := r.rdb.ClientPause(ctx, pauseFor).Err(); err != nil {
		return "", err
	}
	r.until = time.Now().Add(pauseFor)
	return fmt.Sprintf("Redis is paused for %v (CLIENT PAUSE ALL): it accepts connections and answers nothing, the hardest outage", pauseFor), nil
}

func (r *redisControl) resume(ctx context.Context) (string, error) {
	select {
	case <-time.After(time.Until(r.until)):
	case <-ctx.Done():
		return "", ctx.Err()
	}
	return "the pause is over and Redis answers again; the replicas were not restarted", nil
}

// clearLimits deletes the limiter's keys (rl:*), so that a run does not inherit the blocks of
// the one before it.
func (r *redisControl) clearLimits(ctx context.Context) (int, error) {
	n := 0
	iter := r.rdb.Scan(ctx, 0, "rl:*", 1000).Iterator()
	for iter.Next(ctx) {
		if err := r.rdb.Del(ctx, iter.Val()).Err(); err != nil {
			return n, err
		}
		n++
	}
	if err := iter.Err(); err != nil && !errors.Is(err, redis.Nil) {
		return n, err
	}
	return n, nil
}
