// Package config owns the process's configuration: every environment variable of the contract,
// its default, and its validation. Load reports every invalid variable at once, by name, so an
// operator fixes a deployment in one pass.
package config

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/pixlimit/pixlimit/internal/ratelimit"
)

// Config is the validated configuration. The env-tagged fields mirror the contract's table; the
// others are derived from them by Load.
type Config struct {
	HTTPAddr             string        `env:"HTTP_ADDR" envDefault:":8080"`
	RedisURL             string        `env:"REDIS_URL"`
	RedisClusterAddrs    string        `env:"REDIS_CLUSTER_ADDRS"`
	RedisSentinelAddrs   string        `env:"REDIS_SENTINEL_ADDRS"`
	RedisSentinelMaster  string        `env:"REDIS_SENTINEL_MASTER"`
	DatabaseURL          string        `env:"DATABASE_URL"`
	DBTimeout            time.Duration `env:"DB_TIMEOUT" envDefault:"2s"`
	RedisTimeout         time.Duration `env:"REDIS_TIMEOUT" envDefault:"100ms"`
	AuthSecret           string        `env:"AUTH_SECRET"`
	TokenTTL             time.Duration `env:"TOKEN_TTL" envDefault:"15m"`
	TrustedProxiesRaw    string        `env:"TRUSTED_PROXIES"`
	PIXLimit             int           `env:"PIX_LIMIT" envDefault:"10"`
	PIXWindow            time.Duration `env:"PIX_WINDOW" envDefault:"1m"`
	PIXFailMode          string        `env:"PIX_FAIL_MODE" envDefault:"closed"`
	PIXAlgorithm         string        `env:"PIX_ALGORITHM" envDefault:"sliding_log"`
	PIXBurst             int           `env:"PIX_BURST"`
	StatementLimit       int           `env:"STATEMENT_LIMIT" envDefault:"30"`
	StatementWindow      time.Duration `env:"STATEMENT_WINDOW" envDefault:"1m"`
	StatementFailMode    string        `env:"STATEMENT_FAIL_MODE" envDefault:"open"`
	StatementAlgorithm   string        `env:"STATEMENT_ALGORITHM" envDefault:"sliding_log"`
	StatementBurst       int           `env:"STATEMENT_BURST"`
	LoginIPLimit         int           `env:"LOGIN_IP_LIMIT" envDefault:"10"`
	LoginAccountLimit    int           `env:"LOGIN_ACCOUNT_LIMIT" envDefault:"5"`
	LoginWindow          time.Duration `env:"LOGIN_WINDOW" envDefault:"10m"`
	LoginFailMode        string        `env:"LOGIN_FAIL_MODE" envDefault:"closed"`
	LoginAlgorithm       string        `env:"LOGIN_ALGORITHM" envDefault:"sliding_log"`
	LoginBurst           int           `env:"LOGIN_BURST"`
	FailClosedRetryAfter time.Duration `env:"FAIL_CLOSED_RETRY_AFTER" envDefault:"5s"`
	DemoAccountsRaw      string        `env:"DEMO_ACCOUNTS"`
	LogLevelRaw          string        `env:"LOG_LEVEL" envDefault:"info"`
	LogFormat            string        `env:"LOG_FORMAT" envDefault:"text"`

	// Derived by Load.
	// DemoAccounts says whether to seed the demo accounts: DEMO_ACCOUNTS when set, else only
	// into the in-memory ledger (never, unasked, into a DATABASE_URL database).
	DemoAccounts   bool             `env:"-"`
	TrustedProxies []netip.Prefix   `env:"-"`
	Redis          *redis.Options   `env:"-"` // from REDIS_URL; nil in the other modes
	RedisCluster   []string         `env:"-"` // seed nodes of a Redis Cluster
	RedisSentinel  []string         `env:"-"` // sentinels watching RedisSentinelMaster
	LogLevel       slog.Level       `env:"-"`
	PIX            ratelimit.Policy `env:"-"`
	Statement      ratelimit.Policy `env:"-"`
	LoginIP        ratelimit.Policy `env:"-"`
	LoginAccount   ratelimit.Policy `env:"-"`
}

// Load reads the configuration through getenv (os.Getenv in production; a map in tests, so they
// can run in parallel). Its error lists every invalid variable, one per line, each as
// "NAME: why".
func Load(getenv func(string) string) (Config, error) {
	var cfg Config
	environ := map[string]string{}
	params, err := env.GetFieldParams(&cfg)
	if err != nil {
		return Config{}, fmt.Errorf("config: %w", err)
	}
	for _, p := range params {
		if v := getenv(p.Key); v != "" {
			environ[p.Key] = v
		}
	}

	var problems []string
	bad := func(name, format string, args ...any) {
		problems = append(problems, name+": "+fmt.Sprintf(format, args...))
	}
	if err := env.ParseWithOptions(&cfg, env.Options{Environment: environ}); err != nil {
		var agg env.AggregateError
		if !errors.As(err, &agg) {
			return Config{}, fmt.Errorf("config: %w", err)
		}
		for _, e := range agg.Errors {
			var pe env.ParseError
			if !errors.As(e, &pe) {
				return Config{}, fmt.Errorf("config: %w", e)
			}
			f, _ := reflect.TypeFor[Config]().FieldByName(pe.Name)
			name := f.Tag.Get("env")
			bad(name, "%q is not a valid %s", environ[name], kind(pe.Type))
		}
	}
	parsed := func(name string) bool { // a variable that failed to parse is reported once
		for _, p := range problems {
			if strings.HasPrefix(p, name+":") {
				return false
			}
		}
		return true
	}

	if _, _, err := net.SplitHostPort(cfg.HTTPAddr); err != nil {
		bad("HTTP_ADDR", "%q is not host:port", cfg.HTTPAddr)
	}
	if cfg.RedisURL != "" {
		opt, err := redis.ParseURL(cfg.RedisURL)
		if err != nil {
			bad("REDIS_URL", "not a redis://, rediss:// or unix:// URL (%v)", redactURLError(err, cfg.RedisURL))
		} else {
			cfg.Redis = opt
		}
	}
	cfg.RedisCluster = addrList("REDIS_CLUSTER_ADDRS", cfg.RedisClusterAddrs, bad)
	cfg.RedisSentinel = addrList("REDIS_SENTINEL_ADDRS", cfg.RedisSentinelAddrs, bad)
	if (cfg.RedisSentinelAddrs == "") != (cfg.RedisSentinelMaster == "") {
		bad("REDIS_SENTINEL_MASTER", "REDIS_SENTINEL_ADDRS and REDIS_SENTINEL_MASTER go together")
	}
	modes := 0
	for _, v := range []string{cfg.RedisURL, cfg.RedisClusterAddrs, cfg.RedisSentinelAddrs} {
		if v != "" {
			modes++
		}
	}
	if modes > 1 {
		bad("REDIS_URL", "set one of REDIS_URL, REDIS_CLUSTER_ADDRS or REDIS_SENTINEL_ADDRS, not several")
	}
	if cfg.DatabaseURL != "" {
		scheme, _, _ := strings.Cut(cfg.DatabaseURL, "://")
		if _, err := pgxpool.ParseConfig(cfg.DatabaseURL); err != nil || (scheme != "postgres" && scheme != "postgresql") {
			bad("DATABASE_URL", "not a postgres:// URL")
		}
	}
	if parsed("REDIS_TIMEOUT") && (cfg.RedisTimeout < time.Millisecond || cfg.RedisTimeout > time.Minute) {
		bad("REDIS_TIMEOUT", "%v: want between 1ms and 1m", cfg.RedisTimeout)
	}
	if parsed("DB_TIMEOUT") && (cfg.DBTimeout < 10*time.Millisecond || cfg.DBTimeout > time.Minute) {
		bad("DB_TIMEOUT", "%v: want between 10ms and 1m", cfg.DBTimeout)
	}
	switch {
	case cfg.AuthSecret != "" && len(cfg.AuthSecret) < 32:
		bad("AUTH_SECRET", "%d bytes: want at least 32 random bytes (openssl rand -base64 48)", len(cfg.AuthSecret))
	case slices.Contains(publishedSecrets, cfg.AuthSecret):
		bad("AUTH_SECRET", "this value is published in pixlimit's repository: anyone could sign tokens with it; "+
			"make your own (openssl rand -base64 48)")
	case cfg.AuthSecret == "" && modes > 0:
		// Each replica would draw its own: tokens would not cross replicas, and every limit would
		// be multiplied by the number of replicas, since each keys Redis with its own hash.
		bad("AUTH_SECRET", "required with a shared Redis (REDIS_URL, REDIS_CLUSTER_ADDRS or REDIS_SENTINEL_ADDRS): "+
			"every replica must use the same one (openssl rand -base64 48)")
	}
	cfg.DemoAccounts = cfg.DatabaseURL == ""
	if cfg.DemoAccountsRaw != "" {
		seed, err := strconv.ParseBool(cfg.DemoAccountsRaw)
		if err != nil {
			bad("DEMO_ACCOUNTS", "%q: want true or false", cfg.DemoAccountsRaw)
		}
		cfg.DemoAccounts = seed
	}
	if parsed("TOKEN_TTL") && cfg.TokenTTL < time.Second {
		bad("TOKEN_TTL", "%v: want at least 1s", cfg.TokenTTL)
	}
	for _, s := range strings.Split(cfg.TrustedProxiesRaw, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			bad("TRUSTED_PROXIES", "%q is not a CIDR (like 10.0.0.0/8 or fd00::/8)", s)
			continue
		}
		cfg.TrustedProxies = append(cfg.TrustedProxies, p.Masked())
	}
	if parsed("FAIL_CLOSED_RETRY_AFTER") && (cfg.FailClosedRetryAfter < time.Second || cfg.FailClosedRetryAfter%time.Second != 0) {
		bad("FAIL_CLOSED_RETRY_AFTER", "%v: want whole seconds, at least 1s", cfg.FailClosedRetryAfter)
	}
	if err := cfg.LogLevel.UnmarshalText([]byte(cfg.LogLevelRaw)); err != nil || !slices.Contains([]string{"debug", "info", "warn", "error"}, strings.ToLower(cfg.LogLevelRaw)) {
		bad("LOG_LEVEL", "%q: want debug, info, warn or error", cfg.LogLevelRaw)
	}
	if !slices.Contains([]string{"text", "json"}, cfg.LogFormat) {
		bad("LOG_FORMAT", "%q: want text or json", cfg.LogFormat)
	}

	// route reads one route's algorithm and burst, reporting each problem once.
	route := func(prefix, algorithm string, burst int) (ratelimit.Algorithm, int) {
		a, err := ratelimit.ParseAlgorithm(algorithm)
		if err != nil {
			bad(prefix+"_ALGORITHM", "%q: want one of %v", algorithm, ratelimit.Algorithms)
		}
		_, set := environ[prefix+"_BURST"]
		switch {
		case !parsed(prefix+"_BURST") || !set:
		case burst < 1:
			bad(prefix+"_BURST", "%d: want at least 1", burst)
		case err == nil && a != ratelimit.TokenBucket && a != ratelimit.GCRA:
			bad(prefix+"_BURST", "only token_bucket and gcra take a burst; %s_ALGORITHM is %s", prefix, a)
		}
		return a, max(burst, 0)
	}
	policy := func(name, limitVar string, limit int, window time.Duration, mode, routeVar string, a ratelimit.Algorithm, burst int) ratelimit.Policy {
		if parsed(limitVar) && limit < 1 {
			bad(limitVar, "%d: want at least 1", limit)
		}
		if parsed(routeVar+"_WINDOW") && (window < time.Second || window%time.Second != 0) {
			bad(routeVar+"_WINDOW", "%v: want whole seconds, at least 1s", window)
		}
		m, err := ratelimit.ParseFailMode(mode)
		if err != nil {
			bad(routeVar+"_FAIL_MODE", "%q: want open or closed", mode)
		}
		p := ratelimit.Policy{Name: name, Limit: limit, Window: window, Algorithm: a, Burst: burst, FailMode: m}
		if err := p.Validate(); err != nil && len(problems) == 0 {
			bad(limitVar, "%v", err) // what the individual checks cannot see, such as limit × window
		}
		return p
	}
	a, burst := route("PIX", cfg.PIXAlgorithm, cfg.PIXBurst)
	cfg.PIX = policy("pix", "PIX_LIMIT", cfg.PIXLimit, cfg.PIXWindow, cfg.PIXFailMode, "PIX", a, burst)
	a, burst = route("STATEMENT", cfg.StatementAlgorithm, cfg.StatementBurst)
	cfg.Statement = policy("statement", "STATEMENT_LIMIT", cfg.StatementLimit, cfg.StatementWindow, cfg.StatementFailMode, "STATEMENT", a, burst)
	a, burst = route("LOGIN", cfg.LoginAlgorithm, cfg.LoginBurst)
	cfg.LoginIP = policy("login-ip", "LOGIN_IP_LIMIT", cfg.LoginIPLimit, cfg.LoginWindow, cfg.LoginFailMode, "LOGIN", a, burst)
	cfg.LoginAccount = policy("login-account", "LOGIN_ACCOUNT_LIMIT", cfg.LoginAccountLimit, cfg.LoginWindow, cfg.LoginFailMode, "LOGIN", a, burst)

	if len(problems) > 0 {
		return Config{}, &Error{Problems: dedupe(problems)}
	}
	return cfg, nil
}

// publishedSecrets are AUTH_SECRET values that appear, or once appeared, in this repository
// (compose file, documentation, tests): anyone can read them, so none may sign a real token.
// TestPublishedSecretsAreRefused checks that every AUTH_SECRET written in the repository is here.
var publishedSecrets = []string{
	"dev-only-secret-change-me-0123456789abcdef",
	"test-secret-test-secret-test-secret!",
	"fleet-secret-fleet-secret-fleet-secret",
	"0123456789abcdef0123456789abcdef",
	"another-secret-another-secret-xx",
	"ssssssssssssssssssssssssssssssss",
}

// addrList parses comma-separated host:port addresses, each with a host and a numeric port.
func addrList(name, list string, bad func(string, string, ...any)) []string {
	var addrs []string
	for _, a := range strings.Split(list, ",") {
		if a = strings.TrimSpace(a); a == "" {
			continue
		}
		host, port, err := net.SplitHostPort(a)
		if n, perr := strconv.Atoi(port); err != nil || host == "" || perr != nil || n < 1 || n > 65535 {
			bad(name, "%q is not host:port with a port from 1 to 65535", a)
			continue
		}
		addrs = append(addrs, a)
	}
	return addrs
}

// Error lists every invalid variable.
type Error struct {
	// Problems holds one "NAME: why" per invalid variable.
	Problems []string
}

func (e *Error) Error() string {
	return "invalid configuration:\n  " + strings.Join(e.Problems, "\n  ")
}

func kind(t reflect.Type) string {
	switch t {
	case reflect.TypeFor[time.Duration]():
		return "duration (like 100ms, 1m)"
	case reflect.TypeFor[bool]():
		return "boolean (true or false)"
	case reflect.TypeFor[int]():
		return "integer"
	}
	return t.String()
}

// redactURLError keeps a password in REDIS_URL out of the error message.
func redactURLError(err error, url string) string {
	msg := err.Error()
	if _, rest, ok := strings.Cut(url, "://"); ok {
		if userinfo, _, ok := strings.Cut(rest, "@"); ok && userinfo != "" {
			msg = strings.ReplaceAll(msg, userinfo, "REDACTED")
		}
	}
	return msg
}

func dedupe(ss []string) []string {
	seen := map[string]bool{}
	out := ss[:0]
	for _, s := range ss {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}
