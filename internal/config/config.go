// Package config owns the process's configuration: every environment variable of the contract,
// its default, and its validation. Load reports every invalid variable at once, by name, so an
// operator fixes a deployment in one pass. The rules of the domain (what makes a rate-limit
// policy valid) are the domain packages' own: config calls them and names the variable.
package config

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
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

	"github.com/pixlimit/pixlimit/internal/dict"
	"github.com/pixlimit/pixlimit/internal/enforce"
	"github.com/pixlimit/pixlimit/internal/pix"
	"github.com/pixlimit/pixlimit/internal/ratelimit"
	"github.com/pixlimit/pixlimit/internal/ratelimit/breaker"
)

// Config is the validated configuration: typed values only, each made from its variables by
// Load in one pass (environment is what the variables say, as written).
type Config struct {
	HTTPAddr string
	// MaxConnections bounds the public listener's open connections (HTTP_MAX_CONNECTIONS).
	MaxConnections int
	// MetricsAddr is the metrics listener's address; empty: none.
	MetricsAddr string
	// AdminAddr is the support desk's listener (ADMIN_ADDR); empty: none. AdminToken is its
	// bearer token (ADMIN_TOKEN), required with it.
	AdminAddr, AdminToken string
	// Redis is the Redis to use: of REDIS_URL, a cluster, sentinels, or none set (embedded).
	Redis Redis
	// RedisTimeout is the budget of one limiter decision.
	RedisTimeout time.Duration
	// DatabaseURL is the PostgreSQL ledger's; empty: the in-memory ledger.
	DatabaseURL string
	// DBTimeout is the deadline of one ledger call up to COMMIT, and COMMIT's own.
	DBTimeout time.Duration
	// LedgerAccountShare is how many of the replica's ledger calls one account may have in
	// progress at once (pix.Share), below the pool's size; a call past it waits at most DBTimeout.
	LedgerAccountShare int
	// AuthSecret keys every token and rate-limit hash; empty: random (embedded Redis only).
	AuthSecret          string
	TokenTTL, DeviceTTL time.Duration
	// DeviceRegistrationDelay is how long a new device waits to register for PIX while the
	// account has a registered one; 0 registers at once.
	DeviceRegistrationDelay time.Duration
	// Money are the limits on money the ledger enforces: the night cap, the day limit, the
	// new-device caps and the delay of a customer's increase.
	Money          pix.Rules
	TrustedProxies []netip.Prefix
	// Limits are the routes' validated limits, as the HTTP layer takes them.
	Limits enforce.RouteLimits
	// Limiter are the limiter's options from REDIS_TIMEOUT and RATELIMIT_*; the caller adds
	// KeySecret and Logger.
	Limiter ratelimit.Options
	// DenyCacheSize is RATELIMIT_DENY_CACHE_SIZE: the keys the deny cache (package denycache)
	// remembers as full; 0 means no deny cache.
	DenyCacheSize int
	// FleetSize is RATELIMIT_FLEET_SIZE: the fewest replicas the outage fallback assumes share
	// the limits (package fallback). MaxWaiting is THROTTLE_MAX_WAITING: the most requests one
	// replica holds until their turns in a queue (package queue).
	FleetSize, MaxWaiting int
	// Breaker is RATELIMIT_BREAKER_*: Failures 0 means no breaker. The caller adds Probe and Logger.
	Breaker breaker.Options
	// BatchMax is RATELIMIT_BATCH_MAX: the most decisions one call to Redis carries (package
	// batch); 1 sends each alone. A Redis Cluster is never batched.
	BatchMax int
	// DemoAccounts says whether to seed the demo accounts: DEMO_ACCOUNTS when set, else only
	// into the in-memory ledger (never, unasked, into a DATABASE_URL database).
	DemoAccounts bool
	LogLevel     slog.Level
	LogFormat    string // text or json
	// Deprecated are the variables set under a former name: each is worth a warning at start,
	// though the configuration is valid all the same.
	Deprecated []Deprecation
	// MoneyOffRules are the money rules set apart from what the central bank asks of a real bank
	// (docs/rules.md), each "VARIABLE=value: what the rule is": worth a warning at start, valid
	// all the same (a test or a demo may want a short delay or no cap).
	MoneyOffRules []string
}

// Deprecation is a variable set under its former name, Old, that the contract renamed New. The
// value is read from Old while New is unset; when both are set, New wins and Old is Ignored.
type Deprecation struct {
	Old, New string
	Ignored  bool
}

// Redis is the Redis mode: at most one of URL, Cluster and Sentinel is set; none means the
// embedded Redis.
type Redis struct {
	URL            *redis.Options // from REDIS_URL
	Cluster        []string       // seed nodes of a Redis Cluster
	Sentinel       []string       // sentinels watching SentinelMaster
	SentinelMaster string
}

// environment is what the variables say, as written: the contract's table, parsed but not yet
// checked or combined.
type environment struct {
	HTTPAddr             string         `env:"HTTP_ADDR" envDefault:":8080"`
	MaxConnections       int            `env:"HTTP_MAX_CONNECTIONS" envDefault:"10000"`
	MetricsAddr          string         `env:"METRICS_ADDR" envDefault:":9464"`
	AdminAddr            string         `env:"ADMIN_ADDR"`
	AdminToken           string         `env:"ADMIN_TOKEN"`
	RedisURL             string         `env:"REDIS_URL"`
	RedisClusterAddrs    string         `env:"REDIS_CLUSTER_ADDRS"`
	RedisSentinelAddrs   string         `env:"REDIS_SENTINEL_ADDRS"`
	RedisSentinelMaster  string         `env:"REDIS_SENTINEL_MASTER"`
	RedisTimeout         time.Duration  `env:"REDIS_TIMEOUT" envDefault:"100ms"`
	DatabaseURL          string         `env:"DATABASE_URL"`
	DBTimeout            time.Duration  `env:"DB_TIMEOUT" envDefault:"2s"`
	LedgerAccountShare   int            `env:"LEDGER_ACCOUNT_SHARE" envDefault:"2"`
	AuthSecret           string         `env:"AUTH_SECRET"`
	TokenTTL             time.Duration  `env:"TOKEN_TTL" envDefault:"15m"`
	DeviceTTL            time.Duration  `env:"DEVICE_TTL" envDefault:"720h"`
	DeviceRegistration   time.Duration  `env:"DEVICE_REGISTRATION_DELAY" envDefault:"24h"`
	NightLimitCents      int64          `env:"NIGHT_LIMIT_CENTS" envDefault:"100000"`
	NightStart           string         `env:"NIGHT_START" envDefault:"20:00"`
	NightEnd             string         `env:"NIGHT_END" envDefault:"06:00"`
	DayLimitCents        int64          `env:"DAY_LIMIT_CENTS" envDefault:"1000000"`
	NewDeviceTransfer    int64          `env:"NEW_DEVICE_TRANSFER_LIMIT_CENTS" envDefault:"20000"`
	NewDeviceDay         int64          `env:"NEW_DEVICE_DAY_LIMIT_CENTS" envDefault:"100000"`
	IncreaseDelay        time.Duration  `env:"LIMIT_INCREASE_DELAY" envDefault:"24h"`
	LookupCapacity       int            `env:"LOOKUP_CAPACITY" envDefault:"100"`
	LookupRefill         int            `env:"LOOKUP_REFILL_PER_MINUTE" envDefault:"2"`
	LookupMissCost       int            `env:"LOOKUP_MISS_COST" envDefault:"20"`
	LookupCapacityPJ     int            `env:"LOOKUP_CAPACITY_PJ" envDefault:"1000"`
	LookupRefillPJ       int            `env:"LOOKUP_REFILL_PER_MINUTE_PJ" envDefault:"20"`
	ParticipantCategory  string         `env:"LOOKUP_PARTICIPANT_CATEGORY" envDefault:"D"`
	ParticipantCapacity  int            `env:"LOOKUP_PARTICIPANT_CAPACITY"`          // 0: the category's
	ParticipantRefill    int            `env:"LOOKUP_PARTICIPANT_REFILL_PER_MINUTE"` // 0: the category's
	TrustedProxies       []netip.Prefix `env:"TRUSTED_PROXIES"`
	FailClosedRetryAfter time.Duration  `env:"FAIL_CLOSED_RETRY_AFTER" envDefault:"5s"`
	DenyCacheSize        int            `env:"RATELIMIT_DENY_CACHE_SIZE" envDefault:"100000"`
	DenyCacheSizeFormer  *int           `env:"RATELIMIT_LOCAL_CACHE_SIZE"` // the former name (deprecated); nil when unset
	denyCacheName        string         // the variable DenyCacheSize was read from, to name it in a problem
	BreakerFailures      int            `env:"RATELIMIT_BREAKER_FAILURES" envDefault:"5"`
	BreakerCooldown      time.Duration  `env:"RATELIMIT_BREAKER_COOLDOWN" envDefault:"1s"`
	BatchMax             int            `env:"RATELIMIT_BATCH_MAX" envDefault:"32"`
	FleetSize            int            `env:"RATELIMIT_FLEET_SIZE" envDefault:"2"`
	ThrottleMaxWaiting   int            `env:"THROTTLE_MAX_WAITING" envDefault:"1000"`
	PIXConcurrency       int            `env:"PIX_CONCURRENCY" envDefault:"2"`
	ConcurrencyLease     time.Duration  `env:"CONCURRENCY_LEASE" envDefault:"10s"`
	leaseSet             bool           // CONCURRENCY_LEASE was set: never lengthened to the longest PIX
	deprecated           []Deprecation  // the variables set under a former name (Config.Deprecated)
	DemoAccountsSet      *bool          `env:"DEMO_ACCOUNTS"` // nil when unset
	LogLevel             slog.Level     `env:"LOG_LEVEL" envDefault:"info"`
	LogFormat            string         `env:"LOG_FORMAT" envDefault:"text"`

	// The routes, each read with its prefix (PIX_LIMIT, STATEMENT_WINDOW, LOGIN_IP_LIMIT, ...).
	PIX       Route      `env:"-"`
	Statement Route      `env:"-"`
	Login     LoginRoute `env:"-"`
	// Settings limits the account's settings routes (limits, devices, look-up buckets), per
	// account and device: SETTINGS_LIMIT, SETTINGS_WINDOW, SETTINGS_FAIL_MODE.
	Settings Route `env:"-"`
}

// Route is one limited route's variables, read with the route's prefix.
type Route struct {
	Limit     int                 `env:"LIMIT"`
	Window    time.Duration       `env:"WINDOW"`
	FailMode  enforce.FailMode    `env:"FAIL_MODE"`
	Algorithm ratelimit.Algorithm `env:"ALGORITHM"`
	Burst     int                 `env:"BURST"`
	Queue     int                 `env:"QUEUE"` // leaky_bucket only; 0: the default (defaultQueue)
	Mode      Mode                `env:"MODE"`
}

// Mode is a route's MODE: enforce its limit, or only watch it (shadow).
type Mode string

// UnmarshalText parses "enforce" or "shadow".
func (m *Mode) UnmarshalText(text []byte) error {
	if s := string(text); s == "enforce" || s == "shadow" {
		*m = Mode(s)
		return nil
	}
	return errors.New("want enforce or shadow")
}

// The modes of a route.
const (
	EnforceMode Mode = "enforce"
	ShadowMode  Mode = "shadow"
)

// As is the route's limit under the given name: its policy, fail mode and mode. A queue
// (leaky_bucket) without QUEUE has as many places as turns come in 5 seconds, at least 1.
func (r Route) As(name string) enforce.RouteLimit {
	if r.Algorithm == ratelimit.LeakyBucket && r.Queue == 0 && r.Limit > 0 && r.Window >= time.Duration(r.Limit) {
		r.Queue = max(1, int(defaultQueue/(r.Window/time.Duration(r.Limit))))
	}
	return enforce.RouteLimit{Policy: ratelimit.Policy{Name: name, Limit: r.Limit, Window: r.Window, Algorithm: r.Algorithm, Burst: r.Burst, Queue: r.Queue},
		FailMode: r.FailMode, Shadow: r.Mode == ShadowMode}
}

// LoginRoute is the login's variables: two limits, by client IP and by document, over one window,
// fail mode and algorithm (the two keys are decided in one script).
type LoginRoute struct {
	IPLimit      int                 `env:"IP_LIMIT"`
	NetLimit     int                 `env:"NET_LIMIT"` // an IPv6 client's /48 (login-net)
	AccountLimit int                 `env:"ACCOUNT_LIMIT"`
	DeviceLimit  int                 `env:"DEVICE_LIMIT"` // a trusted device's own key (see auth.Devices)
	Window       time.Duration       `env:"WINDOW"`
	FailMode     enforce.FailMode    `env:"FAIL_MODE"`
	Algorithm    ratelimit.Algorithm `env:"ALGORITHM"`
	Burst        int                 `env:"BURST"`
	Mode         Mode                `env:"MODE"`
}

// defaults are the contract's defaults of the route variables.
func defaults() environment {
	return environment{
		PIX:       Route{Limit: 10, Window: time.Minute, FailMode: enforce.FailClosed, Algorithm: ratelimit.SlidingLog, Mode: EnforceMode},
		Statement: Route{Limit: 30, Window: time.Minute, FailMode: enforce.FailFallback, Algorithm: ratelimit.SlidingLog, Mode: EnforceMode},
		Login: LoginRoute{IPLimit: 10, NetLimit: 1000, AccountLimit: 5, DeviceLimit: 5, Window: 10 * time.Minute, FailMode: enforce.FailClosed,
			Algorithm: ratelimit.SlidingLog, Mode: EnforceMode},
		Settings: Route{Limit: 20, Window: time.Minute, FailMode: enforce.FailClosed, Algorithm: ratelimit.SlidingLog, Mode: EnforceMode},
	}
}

// Load reads the configuration through lookup (Environ(os.Environ()) in production; Map in tests, so
// they can run in parallel). A variable set empty means its default, but for METRICS_ADDR, where
// empty disables the metrics. Its error, an *Error, lists every invalid variable, each as
// "NAME: why".
func Load(lookup func(string) (string, bool)) (Config, error) {
	getenv := func(k string) string { v, _ := lookup(k); return v }
	cfg := defaults()
	var p problems
	parts := []struct {
		prefix string
		target any
	}{{"", &cfg}, {"PIX_", &cfg.PIX}, {"STATEMENT_", &cfg.Statement}, {"LOGIN_", &cfg.Login}, {"SETTINGS_", &cfg.Settings}}
	for _, part := range parts {
		if err := parse(part.target, part.prefix, getenv, &p); err != nil {
			return Config{}, err
		}
	}
	// In the contract's order (slices, not maps: the report reads the same on every run).
	for _, r := range []struct {
		prefix string
		burst  int
	}{{"PIX_", cfg.PIX.Burst}, {"STATEMENT_", cfg.Statement.Burst}, {"LOGIN_", cfg.Login.Burst}, {"SETTINGS_", cfg.Settings.Burst}} {
		if getenv(r.prefix+"BURST") != "" && r.burst < 1 { // zero means "the limit" only when unset
			p.add(r.prefix+"BURST", "%d: want at least 1", r.burst)
		}
	}
	for _, r := range []struct {
		prefix string
		queue  int
	}{{"PIX_", cfg.PIX.Queue}, {"STATEMENT_", cfg.Statement.Queue}} {
		if getenv(r.prefix+"QUEUE") != "" && r.queue < 1 { // zero means "the turns of 5s" only when unset
			p.add(r.prefix+"QUEUE", "%d: want 1 to 100000", r.queue)
		}
	}
	for _, name := range []string{"LOGIN_QUEUE", "SETTINGS_QUEUE"} {
		if getenv(name) != "" {
			p.add(name, "only the PIX and the statement take a queue (leaky_bucket): a waiting login or setting would hold a connection for an attacker")
		}
	}
	cfg.leaseSet = getenv("CONCURRENCY_LEASE") != ""
	// The deny cache's size was RATELIMIT_LOCAL_CACHE_SIZE before wave 5: read while the new name
	// is unset, reported either way.
	cfg.denyCacheName = "RATELIMIT_DENY_CACHE_SIZE"
	if cfg.DenyCacheSizeFormer != nil {
		d := Deprecation{Old: "RATELIMIT_LOCAL_CACHE_SIZE", New: cfg.denyCacheName, Ignored: getenv(cfg.denyCacheName) != ""}
		if !d.Ignored {
			cfg.DenyCacheSize, cfg.denyCacheName = *cfg.DenyCacheSizeFormer, d.Old
		}
		cfg.deprecated = append(cfg.deprecated, d)
	}
	if v, set := lookup("METRICS_ADDR"); set && v == "" {
		cfg.MetricsAddr = "" // set empty: no metrics listener
	}
	out := cfg.check(&p)
	if len(p.list) > 0 {
		return Config{}, &Error{Problems: p.list}
	}
	return out, nil
}

// Map is a lookup over m, for tests and for programs that build their own environment.
func Map(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// Environ is the lookup of an environment given as os.Environ lists it ("KEY=value"), the
// last of a repeated key winning, as in os/exec.
func Environ(environ []string) func(string) (string, bool) {
	m := map[string]string{}
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	return Map(m)
}

// Pairs is m as os.Environ lists an environment (for Environ and Unknown), sorted.
func Pairs(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return out
}

// prefixes are the contract's: a variable that begins with one of them is the configuration's,
// and one it does not know is most likely misspelled (PIX_LIMT=5 would leave PIX_LIMIT at 10).
var prefixes = []string{"PIX_", "LOGIN_", "STATEMENT_", "LOOKUP_", "SETTINGS_", "REDIS_", "RATELIMIT_", "DB_",
	"DEVICE_", "ADMIN_", "METRICS_", "NIGHT_", "DAY_", "NEW_DEVICE_", "THROTTLE_", "CONCURRENCY_", "LEDGER_"}

// Unknown lists, sorted, the variables of environ (as os.Environ lists it) that begin with one
// of the contract's prefixes but that the configuration does not read: each is worth a warning
// at start, since a misspelled limit is otherwise silently left at its default.
func Unknown(environ []string) []string {
	known := map[string]bool{}
	cfg := defaults()
	for _, part := range []struct {
		prefix string
		target any
	}{{"", &cfg}, {"PIX_", &cfg.PIX}, {"STATEMENT_", &cfg.Statement}, {"LOGIN_", &cfg.Login}, {"SETTINGS_", &cfg.Settings}} {
		params, _ := env.GetFieldParamsWithOptions(part.target, env.Options{Prefix: part.prefix})
		for _, f := range params {
			known[f.Key] = true
		}
	}
	known["LOGIN_QUEUE"], known["SETTINGS_QUEUE"] = true, true // read, to be refused by name
	var out []string
	for _, kv := range environ {
		k, _, _ := strings.Cut(kv, "=")
		if !known[k] && slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(k, p) }) && !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// problems collects "NAME: why", at most one per variable: a variable that failed to parse is
// not checked again.
type problems struct{ list []string }

func (p *problems) add(name, format string, args ...any) {
	if !p.has(name) {
		p.list = append(p.list, name+": "+fmt.Sprintf(format, args...))
	}
}

func (p *problems) has(name string) bool {
	return slices.ContainsFunc(p.list, func(s string) bool { return strings.HasPrefix(s, name+": ") })
}

// parse fills target from the variables under prefix, reporting each that does not parse.
func parse(target any, prefix string, getenv func(string) string, p *problems) error {
	opts := env.Options{Prefix: prefix, FuncMap: map[reflect.Type]env.ParserFunc{
		reflect.TypeFor[[]netip.Prefix](): parsePrefixes,
	}}
	params, err := env.GetFieldParamsWithOptions(target, opts)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	opts.Environment = map[string]string{}
	for _, f := range params {
		if v := getenv(f.Key); v != "" {
			opts.Environment[f.Key] = v
		}
	}
	err = env.ParseWithOptions(target, opts)
	var agg env.AggregateError
	if err == nil {
		return nil
	} else if !errors.As(err, &agg) {
		return fmt.Errorf("config: %w", err)
	}
	for _, e := range agg.Errors {
		var pe env.ParseError
		if !errors.As(e, &pe) {
			return fmt.Errorf("config: %w", e)
		}
		f, _ := reflect.TypeOf(target).Elem().FieldByName(pe.Name)
		name := prefix + f.Tag.Get("env")
		if name == "AUTH_SECRET" {
			p.add(name, "invalid")
			continue
		}
		p.add(name, "%q is not a valid %s", opts.Environment[name], kind(pe.Type, pe.Err))
	}
	return nil
}

// parsePrefixes parses comma-separated CIDRs with netip, forgiving spaces ("10.0.0.0/8, fd00::/8")
// and host bits.
func parsePrefixes(list string) (any, error) {
	var prefixes []netip.Prefix
	for _, s := range strings.Split(list, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		pfx, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, err
		}
		prefixes = append(prefixes, pfx.Masked())
	}
	return prefixes, nil
}

// check validates what parsed and makes the Config of it.
func (cfg *environment) check(p *problems) Config {
	out := Config{HTTPAddr: cfg.HTTPAddr, MetricsAddr: cfg.MetricsAddr, RedisTimeout: cfg.RedisTimeout,
		DatabaseURL: cfg.DatabaseURL, DBTimeout: cfg.DBTimeout, LedgerAccountShare: cfg.LedgerAccountShare, AuthSecret: cfg.AuthSecret, TokenTTL: cfg.TokenTTL,
		DeviceTTL: cfg.DeviceTTL, DeviceRegistrationDelay: cfg.DeviceRegistration, TrustedProxies: cfg.TrustedProxies,
		LogLevel: cfg.LogLevel, LogFormat: cfg.LogFormat, Deprecated: cfg.deprecated}
	if !listenAddr(cfg.HTTPAddr) {
		p.add("HTTP_ADDR", "%q is not host:port with a port from 0 to 65535", cfg.HTTPAddr)
	}
	if out.MaxConnections = cfg.MaxConnections; out.MaxConnections < 1 || out.MaxConnections > 1_000_000 {
		p.add("HTTP_MAX_CONNECTIONS", "%d: want 1 to 1,000,000", cfg.MaxConnections)
	}
	out.AdminAddr, out.AdminToken = cfg.AdminAddr, cfg.AdminToken
	cfg.checkAdmin(p)
	switch {
	case cfg.MetricsAddr != "" && !listenAddr(cfg.MetricsAddr):
		p.add("METRICS_ADDR", "%q is not host:port with a port from 0 to 65535 (or empty, for no metrics)", cfg.MetricsAddr)
	case sameListener(cfg.MetricsAddr, cfg.HTTPAddr):
		p.add("METRICS_ADDR", "%q is HTTP_ADDR's: each listener needs an address of its own", cfg.MetricsAddr)
	}
	out.TrustedProxies = checkProxies(p, cfg.TrustedProxies)
	out.Redis = cfg.checkRedis(p)
	pool := int32(pix.MemoryCalls) // the in-memory ledger's places
	if cfg.DatabaseURL != "" {
		scheme, _, _ := strings.Cut(cfg.DatabaseURL, "://")
		pc, err := pgxpool.ParseConfig(cfg.DatabaseURL)
		if err != nil || (scheme != "postgres" && scheme != "postgresql") {
			p.add("DATABASE_URL", "not a postgres:// URL")
		} else {
			pool = pc.MaxConns // pool_max_conns, else pgxpool's default: max(4, the CPUs)
		}
	}
	if cfg.LedgerAccountShare < 1 || int64(cfg.LedgerAccountShare) >= int64(pool) {
		p.add("LEDGER_ACCOUNT_SHARE", "%d: want from 1 to %d, below the ledger's %d connections, so that one account "+
			"never holds them all", cfg.LedgerAccountShare, pool-1, pool)
	}
	between(p, "REDIS_TIMEOUT", cfg.RedisTimeout, time.Millisecond, time.Minute)
	between(p, "DB_TIMEOUT", cfg.DBTimeout, 10*time.Millisecond, time.Minute)
	between(p, "TOKEN_TTL", cfg.TokenTTL, time.Second, 365*24*time.Hour)
	between(p, "DEVICE_TTL", cfg.DeviceTTL, time.Minute, 365*24*time.Hour)
	between(p, "DEVICE_REGISTRATION_DELAY", cfg.DeviceRegistration, 0, 30*24*time.Hour)
	cfg.checkLimiter(p)
	out.Money = cfg.checkMoney(p)
	out.MoneyOffRules = moneyOffRules(out.Money)
	cfg.checkSecret(p)
	out.DemoAccounts = cfg.DatabaseURL == ""
	if cfg.DemoAccountsSet != nil {
		out.DemoAccounts = *cfg.DemoAccountsSet
	}
	out.Limiter = cfg.limiterOptions()
	out.DenyCacheSize, out.FleetSize, out.MaxWaiting = cfg.DenyCacheSize, cfg.FleetSize, cfg.ThrottleMaxWaiting
	out.BatchMax = cfg.BatchMax
	out.Breaker = breaker.Options{Failures: cfg.BreakerFailures, Cooldown: cfg.BreakerCooldown, Timeout: cfg.RedisTimeout}
	if !slices.Contains([]slog.Level{slog.LevelDebug, slog.LevelInfo, slog.LevelWarn, slog.LevelError}, cfg.LogLevel) {
		p.add("LOG_LEVEL", "%v: want debug, info, warn or error", cfg.LogLevel)
	}
	if !slices.Contains([]string{"text", "json"}, cfg.LogFormat) {
		p.add("LOG_FORMAT", "%q: want text or json", cfg.LogFormat)
	}
	out.Limits = cfg.checkRouteLimits(p)
	out.Limits.PIXConcurrency = cfg.checkConcurrency(p)
	if !cfg.leaseSet && out.Limits.PIXConcurrency.Policy.Window < out.LongestRequest() {
		// The default lease outlasts the longest PIX: a slow one never loses its slot mid-request.
		out.Limits.PIXConcurrency.Policy.Window = (out.LongestRequest() + time.Second - 1).Truncate(time.Second)
	}
	if cfg.leaseSet && out.Limits.PIXConcurrency.Policy.Limit > 0 && cfg.ConcurrencyLease < out.LongestRequest() {
		p.add("CONCURRENCY_LEASE", "%v: shorter than the longest PIX (%v): a slow PIX would lose its slot while in progress",
			cfg.ConcurrencyLease, out.LongestRequest())
	}
	cfg.checkLongest(p, out)
	out.Limits.MaxWait = WriteTimeout - writeMargin - out.LongestRequest()
	out.Limits.Budget = cfg.RedisTimeout
	cfg.checkQueues(p, &out)
	return out
}

// checkLongest refuses timeouts with which the longest PIX (out.LongestRequest) would not be
// answered within the write timeout: DB_TIMEOUT and REDIS_TIMEOUT offend together, so each is named.
func (cfg *environment) checkLongest(p *problems, out Config) {
	longest := out.LongestRequest()
	if longest <= WriteTimeout-writeMargin {
		return
	}
	why := fmt.Sprintf("a PIX could take %v (%d limiter decisions of REDIS_TIMEOUT %v each, its statements and "+
		"its COMMIT DB_TIMEOUT %v each, up to %v to learn an unknown outcome), past the %v within which every answer is "+
		"written (the server's write timeout is %v, the shipped HAProxy's 20s); lower DB_TIMEOUT or REDIS_TIMEOUT",
		longest, out.limiterCalls(), cfg.RedisTimeout, cfg.DBTimeout,
		pix.LongestTransfer(cfg.DBTimeout)-2*cfg.DBTimeout, WriteTimeout-writeMargin, WriteTimeout)
	p.add("DB_TIMEOUT", "%v: %s", cfg.DBTimeout, why)
	p.add("REDIS_TIMEOUT", "%v: %s", cfg.RedisTimeout, why)
}

// defaultQueue is a queue's places when *_QUEUE is unset: as many turns as come in 5 seconds,
// at least 1.
const defaultQueue = 5 * time.Second

// checkQueues checks the queues (leaky_bucket: only the PIX and the statement; every turn within
// the wait the write timeout leaves) and sets their places in out.Limits.
func (cfg *environment) checkQueues(p *problems, out *Config) {
	for _, r := range []struct {
		prefix string
		route  Route
		limit  *enforce.RouteLimit
	}{{"PIX_", cfg.PIX, &out.Limits.PIX}, {"STATEMENT_", cfg.Statement, &out.Limits.Statement}} {
		pol := &r.limit.Policy
		if pol.Algorithm != ratelimit.LeakyBucket || pol.Limit < 1 {
			continue
		}
		if r.route.Queue == 0 && time.Duration(pol.Queue)*pol.Pace() > out.Limits.MaxWait { // the default: what fits
			pol.Queue = max(1, int(out.Limits.MaxWait/pol.Pace()))
		}
		if r.route.Queue < 0 || r.route.Queue > 100_000 {
			p.add(r.prefix+"QUEUE", "%d: want 1 to 100000 (or unset: the turns of 5s)", r.route.Queue)
		} else if wait := time.Duration(pol.Queue) * pol.Pace(); wait > out.Limits.MaxWait {
			p.add(r.prefix+"QUEUE", "%d turns of %v take %v, past the %v a request may wait for its turn "+
				"(the write timeout %v, less its margin and the longest request %v): lower it or raise the limit",
				pol.Queue, pol.Pace(), wait, out.Limits.MaxWait, WriteTimeout, out.LongestRequest())
		}
	}
	for _, r := range []struct {
		prefix string
		alg    ratelimit.Algorithm
	}{{"LOGIN_", cfg.Login.Algorithm}, {"SETTINGS_", cfg.Settings.Algorithm}} {
		if r.alg == ratelimit.LeakyBucket {
			p.add(r.prefix+"ALGORITHM", "leaky_bucket queues, and only the PIX and the statement may wait: a waiting "+
				"login would hold a connection for an attacker")
		}
	}
}

// checkConcurrency checks the PIX's in-flight limit and makes it (a zero Limit: off).
func (cfg *environment) checkConcurrency(p *problems) enforce.RouteLimit {
	if cfg.PIXConcurrency < 0 || cfg.PIXConcurrency > 1000 {
		p.add("PIX_CONCURRENCY", "%d: want 0 (off) to 1000 PIX of one account in progress", cfg.PIXConcurrency)
	}
	between(p, "CONCURRENCY_LEASE", cfg.ConcurrencyLease, time.Second, 10*time.Minute)
	if cfg.PIXConcurrency <= 0 {
		return enforce.RouteLimit{}
	}
	return enforce.RouteLimit{Policy: ratelimit.Policy{Name: "pix-concurrency", Limit: cfg.PIXConcurrency,
		Window: cfg.ConcurrencyLease.Truncate(time.Millisecond)}, FailMode: cfg.PIX.FailMode}
}

// checkLimiter checks the limiter's settings: its breaker, deny cache, fleet and batches, and
// the Retry-After of a fail-closed limit.
func (cfg *environment) checkLimiter(p *problems) {
	if cfg.FailClosedRetryAfter%time.Second != 0 {
		p.add("FAIL_CLOSED_RETRY_AFTER", "%v: want whole seconds", cfg.FailClosedRetryAfter)
	}
	between(p, "FAIL_CLOSED_RETRY_AFTER", cfg.FailClosedRetryAfter, time.Second, time.Hour)
	if cfg.DenyCacheSize < 0 || cfg.DenyCacheSize > 10_000_000 {
		p.add(cfg.denyCacheName, "%d: want 0 (off) to 10000000", cfg.DenyCacheSize)
	}
	if cfg.BreakerFailures < 0 {
		p.add("RATELIMIT_BREAKER_FAILURES", "%d: want 0 (off) or more", cfg.BreakerFailures)
	}
	between(p, "RATELIMIT_BREAKER_COOLDOWN", cfg.BreakerCooldown, 10*time.Millisecond, time.Minute)
	if cfg.FleetSize < 1 || cfg.FleetSize > 1000 {
		p.add("RATELIMIT_FLEET_SIZE", "%d: want 1 to 1000 replicas", cfg.FleetSize)
	}
	if cfg.BatchMax < 1 || cfg.BatchMax > 1000 {
		p.add("RATELIMIT_BATCH_MAX", "%d: want 1 (no batching) to 1000", cfg.BatchMax)
	}
	if cfg.ThrottleMaxWaiting < 1 || cfg.ThrottleMaxWaiting > 100_000 {
		p.add("THROTTLE_MAX_WAITING", "%d: want 1 to 100000 requests waiting in one replica", cfg.ThrottleMaxWaiting)
	}
}

// checkMoney checks the ledger's money rules and makes them.
func (cfg *environment) checkMoney(p *problems) pix.Rules {
	rules := pix.Rules{Night: cfg.checkNight(p), DayLimitCents: cfg.DayLimitCents, NewDeviceTransferCents: cfg.NewDeviceTransfer,
		NewDeviceDayCents: cfg.NewDeviceDay, IncreaseDelay: cfg.IncreaseDelay}
	for _, v := range []struct {
		name  string
		cents int64
	}{{"DAY_LIMIT_CENTS", cfg.DayLimitCents}, {"NEW_DEVICE_TRANSFER_LIMIT_CENTS", cfg.NewDeviceTransfer}, {"NEW_DEVICE_DAY_LIMIT_CENTS", cfg.NewDeviceDay}} {
		if v.cents < 0 || v.cents > pix.MaxLimitCents {
			p.add(v.name, "%d: want 0 (off) to %d cents", v.cents, int64(pix.MaxLimitCents))
		}
	}
	if cfg.IncreaseDelay <= 0 {
		p.add("LIMIT_INCREASE_DELAY", "%v: want a positive duration (the central bank asks 24h at least of a real bank)", cfg.IncreaseDelay)
	}
	return rules
}

// moneyOffRules names the rules of r off the central bank's (docs/rules.md): looser than its night
// cap between persons of R$ 1.000,00 over 20:00 to 06:00 (a higher cap, none, or a night that
// leaves part of those hours out), or than its R$ 200,00 a transfer and R$ 1.000,00 a day from a
// device not registered; or a raise in force sooner than 24 hours or later than 48 after it is
// asked. A stricter bank is named nowhere.
func moneyOffRules(r pix.Rules) []string {
	var off []string
	looser := func(name string, cents, rule int64, what string) {
		if cents == 0 || cents > rule {
			off = append(off, fmt.Sprintf("%s=%d: %s", name, cents, what))
		}
	}
	looser("NIGHT_LIMIT_CENTS", r.Night.LimitCents, 100_000, "the central bank caps a night's payments between persons at R$ 1.000,00 (100000)")
	looser("NEW_DEVICE_TRANSFER_LIMIT_CENTS", r.NewDeviceTransferCents, 20_000, "the central bank caps a transfer from a device not registered at R$ 200,00 (20000)")
	looser("NEW_DEVICE_DAY_LIMIT_CENTS", r.NewDeviceDayCents, 100_000, "the central bank caps a day's transfers from devices not registered at R$ 1.000,00 (100000)")
	day := 24 * time.Hour
	length, at20 := (r.Night.End-r.Night.Start+day)%day, (20*time.Hour-r.Night.Start+day)%day
	if at20+10*time.Hour > length { // 20:00 to 06:00 is not all inside the night
		off = append(off, fmt.Sprintf("NIGHT_START=%s, NIGHT_END=%s: the central bank's night covers 20:00 (22:00 at the customer's choice) to 06:00",
			clock(r.Night.Start), clock(r.Night.End)))
	}
	if d := r.IncreaseDelay; d < 24*time.Hour || d > 48*time.Hour {
		off = append(off, fmt.Sprintf("LIMIT_INCREASE_DELAY=%v: the central bank puts a raised limit in force 24 to 48 hours after it is asked", d))
	}
	return off
}

// clock writes a time of day since midnight as HH:MM.
func clock(d time.Duration) string {
	return fmt.Sprintf("%02d:%02d", int(d/time.Hour), int(d%time.Hour/time.Minute))
}

// limiterOptions are the limiter's options.
func (cfg *environment) limiterOptions() ratelimit.Options {
	return ratelimit.Options{Timeout: cfg.RedisTimeout}
}

// checkRouteLimits checks each route's limit and makes them, the look-up's DICT buckets included.
func (cfg *environment) checkRouteLimits(p *problems) enforce.RouteLimits {
	limits := enforce.RouteLimits{
		PIX:                  policy(p, "PIX_", cfg.PIX.As("pix")),
		Statement:            policy(p, "STATEMENT_", cfg.Statement.As("statement")),
		Settings:             policy(p, "SETTINGS_", cfg.Settings.As("account-settings")),
		LoginIP:              policy(p, "LOGIN_", cfg.Login.policy("login-ip", cfg.Login.IPLimit), "IP_LIMIT"),
		LoginNet:             policy(p, "LOGIN_", cfg.Login.policy("login-net", cfg.Login.NetLimit), "NET_LIMIT"),
		LoginAccount:         policy(p, "LOGIN_", cfg.Login.policy("login-account", cfg.Login.AccountLimit), "ACCOUNT_LIMIT"),
		LoginDevice:          policy(p, "LOGIN_", cfg.Login.policy("login-device", cfg.Login.DeviceLimit), "DEVICE_LIMIT"),
		FailClosedRetryAfter: cfg.FailClosedRetryAfter,
		PIXLookup: policy(p, "LOOKUP_", enforce.RouteLimit{Policy: ratelimit.Policy{Name: "pix-lookup", Limit: cfg.LookupRefill, Window: time.Minute,
			Algorithm: ratelimit.TokenBucket, Burst: cfg.LookupCapacity}}, "REFILL_PER_MINUTE", "CAPACITY"),
		LookupMissCost: cfg.LookupMissCost,
		PIXLookupPJ: policy(p, "LOOKUP_", enforce.RouteLimit{Policy: ratelimit.Policy{Name: "pix-lookup", Limit: cfg.LookupRefillPJ, Window: time.Minute,
			Algorithm: ratelimit.TokenBucket, Burst: cfg.LookupCapacityPJ}}, "REFILL_PER_MINUTE_PJ", "CAPACITY_PJ"),
		LookupParticipantMissCost: dict.DefaultParticipantMissCost,
		LookupCategory:            cfg.ParticipantCategory,
	}
	if cfg.LookupCapacity < 1 {
		p.add("LOOKUP_CAPACITY", "%d: want at least 1", cfg.LookupCapacity)
	}
	if cfg.LookupCapacityPJ < 1 {
		p.add("LOOKUP_CAPACITY_PJ", "%d: want at least 1", cfg.LookupCapacityPJ)
	}
	refill, capacity, ok := dict.Category(cfg.ParticipantCategory)
	if !ok {
		p.add("LOOKUP_PARTICIPANT_CATEGORY", "%q: want one of DICT's categories, A to H", cfg.ParticipantCategory)
	}
	for _, v := range []struct {
		name      string
		value     *int
		fromTable int
	}{{"LOOKUP_PARTICIPANT_CAPACITY", &cfg.ParticipantCapacity, capacity}, {"LOOKUP_PARTICIPANT_REFILL_PER_MINUTE", &cfg.ParticipantRefill, refill}} {
		switch {
		case *v.value < 0:
			p.add(v.name, "%d: want 1 or more, or 0 (unset) for the category's", *v.value)
			ok = false
		case *v.value == 0:
			*v.value = v.fromTable
		}
	}
	if ok {
		limits.LookupParticipant = policy(p, "LOOKUP_PARTICIPANT_", enforce.RouteLimit{Policy: ratelimit.Policy{Name: "pix-lookup-participant",
			Limit: cfg.ParticipantRefill, Window: time.Minute, Algorithm: ratelimit.TokenBucket, Burst: cfg.ParticipantCapacity}}, "REFILL_PER_MINUTE", "CAPACITY")
	}
	if cfg.LookupMissCost < 1 {
		p.add("LOOKUP_MISS_COST", "%d: want at least 1", cfg.LookupMissCost)
	}
	return limits
}

func (l LoginRoute) policy(name string, limit int) enforce.RouteLimit {
	return Route{Limit: limit, Window: l.Window, FailMode: l.FailMode, Algorithm: l.Algorithm, Burst: l.Burst, Mode: l.Mode}.As(name)
}

// policy validates pol with the limiter's own rules and reports a problem under the variable
// that holds the offending field: prefix + LIMIT (or names[0]), WINDOW, ALGORITHM, BURST (or
// names[1]) or QUEUE. Windows must also be whole seconds, as the RateLimit headers count in seconds.
func policy(p *problems, prefix string, pol enforce.RouteLimit, names ...string) enforce.RouteLimit {
	vars := map[string]string{"Limit": "LIMIT", "Window": "WINDOW", "Algorithm": "ALGORITHM", "Burst": "BURST", "Queue": "QUEUE"}
	for i, field := range []string{"Limit", "Burst"}[:min(len(names), 2)] {
		vars[field] = names[i]
	}
	// First, so that a window of 0 or 500ms is told the rule of this variable, not the
	// limiter's looser one (p keeps one problem per variable).
	if pol.Policy.Window%time.Second != 0 || pol.Policy.Window < time.Second {
		p.add(prefix+"WINDOW", "%v: want whole seconds, at least 1s", pol.Policy.Window)
	}
	if joined, ok := pol.Policy.Validate().(interface{ Unwrap() []error }); ok {
		for _, err := range joined.Unwrap() {
			var pe *ratelimit.PolicyError
			if errors.As(err, &pe) {
				p.add(prefix+vars[pe.Field], "%s", pe.Reason)
			}
		}
	}
	return pol
}

// WriteTimeout is the HTTP server's write timeout: every answer must be written within it, or the
// client gets none. The shipped proxy (deploy/haproxy.cfg, timeout server 20s) waits longer.
const WriteTimeout = 15 * time.Second

// writeMargin is kept free of WriteTimeout for what LongestRequest does not count: reading the
// body, bcrypt, writing the answer.
const writeMargin = time.Second

// decisionsPerRequest is the most limiter calls one request makes, each within REDIS_TIMEOUT: a
// PIX decides its look-up buckets (a miss's price taken), its own limit and its in-flight slot in
// one call (ratelimit.Limiter.Decide), then settles the buckets and gives the slot back in a
// second (the price given back, a look-up redeemed and refunded). On a Redis Cluster each of
// those steps is a call of its own: the two buckets' prices, the limit, the PIX's mark as its
// key's original taken; then the mark dropped, the two prices given back, a redemption and its
// refunds (two, a company payer's buckets apart): 10 in all, and the slot's (limiterCalls). (A
// PIX that waits for its key's original asks for its mark again within its wait, which MaxWait
// bounds.)
const (
	decisionsPerRequest        = 2
	clusterDecisionsPerRequest = 10
)

// LongestRequest is the longest a request may take before its answer is written: a PIX, with its
// limiter decisions and the ledger's longest transfer (pix.LongestTransfer). Load refuses a
// configuration in which it does not fit in WriteTimeout, so that a client always gets an
// answer, even one saying the transfer's outcome is unknown.
func (cfg Config) LongestRequest() time.Duration {
	return time.Duration(cfg.limiterCalls())*cfg.RedisTimeout + pix.LongestTransfer(cfg.DBTimeout)
}

// limiterCalls is the most limiter calls of one request here: decisionsPerRequest, or
// clusterDecisionsPerRequest on a cluster, and those of the PIX's in-flight slot when it has one.
func (cfg Config) limiterCalls() int {
	slot := cfg.Limits.PIXConcurrency.Policy.Limit > 0
	switch {
	case len(cfg.Redis.Cluster) > 0 && slot:
		return clusterDecisionsPerRequest + 2 // the slot taken (before the limit: httpapi's newAdmission) and given back
	case len(cfg.Redis.Cluster) > 0:
		return clusterDecisionsPerRequest
	case slot:
		return decisionsPerRequest + 1 // a queued PIX (its route's algorithm, or its tier's) takes its slot at its turn
	}
	return decisionsPerRequest
}

func between(p *problems, name string, d, lo, hi time.Duration) {
	if d < lo || d > hi {
		p.add(name, "%v: want between %v and %v", d, lo, hi)
	}
}

// checkRedis parses the Redis mode: REDIS_URL, a cluster's seeds or sentinels, at most one.
func (cfg *environment) checkRedis(p *problems) Redis {
	r := Redis{SentinelMaster: cfg.RedisSentinelMaster}
	if cfg.RedisURL != "" {
		opt, err := redis.ParseURL(cfg.RedisURL)
		if err != nil {
			p.add("REDIS_URL", "not a redis://, rediss:// or unix:// URL with a host, a numeric port and a database "+
				"number (the parser's words are not repeated: they can quote the password; a password with / ? # or @ "+
				"is percent-encoded)")
		}
		r.URL = opt
	}
	r.Cluster = addrList(p, "REDIS_CLUSTER_ADDRS", cfg.RedisClusterAddrs)
	r.Sentinel = addrList(p, "REDIS_SENTINEL_ADDRS", cfg.RedisSentinelAddrs)
	if (cfg.RedisSentinelAddrs == "") != (cfg.RedisSentinelMaster == "") {
		p.add("REDIS_SENTINEL_MASTER", "REDIS_SENTINEL_ADDRS and REDIS_SENTINEL_MASTER go together")
	}
	if set := cfg.redisModesSet(); len(set) > 1 {
		for _, name := range set { // each variable that is set, by its own name
			p.add(name, "set with %s: set one of REDIS_URL, REDIS_CLUSTER_ADDRS or REDIS_SENTINEL_ADDRS, not several",
				strings.Join(slices.DeleteFunc(slices.Clone(set), func(s string) bool { return s == name }), " and "))
		}
	}
	return r
}

// checkNight reads the night-time cap: a limit of 0 disables it; times are HH:MM, São Paulo.
func (cfg *environment) checkNight(p *problems) pix.NightCap {
	night, err := pix.DefaultNightCap()
	if err != nil {
		p.add("NIGHT_START", "%v", err)
		return night
	}
	if cfg.NightLimitCents < 0 {
		p.add("NIGHT_LIMIT_CENTS", "%d: want 0 (off) or more cents", cfg.NightLimitCents)
	}
	night.LimitCents = cfg.NightLimitCents
	for _, n := range []struct {
		name string
		v    *string
	}{{"NIGHT_START", &cfg.NightStart}, {"NIGHT_END", &cfg.NightEnd}} {
		name, v := n.name, n.v
		t, err := time.Parse("15:04", *v)
		if err != nil {
			p.add(name, "%q: want HH:MM", *v)
			continue
		}
		since := time.Duration(t.Hour())*time.Hour + time.Duration(t.Minute())*time.Minute
		if name == "NIGHT_START" {
			night.Start = since
		} else {
			night.End = since
		}
	}
	if night.Start == night.End && !p.has("NIGHT_START") && !p.has("NIGHT_END") {
		p.add("NIGHT_START", "%s equals NIGHT_END: a night of no length, which would void the night limits customers "+
			"set too; to switch off only the bank's default cap, set NIGHT_LIMIT_CENTS=0", cfg.NightStart)
	}
	if slices.Contains(pix.NightStarts, night.End) && !p.has("NIGHT_END") {
		p.add("NIGHT_END", "%s is a night start a customer may choose (20:00 or 22:00): her night would have no length, "+
			"voiding the night limit she set", cfg.NightEnd)
	}
	return night
}

// redisModes counts the Redis modes set; zero means the embedded Redis.
func (cfg *environment) redisModes() int { return len(cfg.redisModesSet()) }

// redisModesSet names the variables of the Redis modes that are set.
func (cfg *environment) redisModesSet() []string {
	var set []string
	for name, v := range map[string]string{"REDIS_URL": cfg.RedisURL, "REDIS_CLUSTER_ADDRS": cfg.RedisClusterAddrs, "REDIS_SENTINEL_ADDRS": cfg.RedisSentinelAddrs} {
		if v != "" {
			set = append(set, name)
		}
	}
	slices.Sort(set)
	return set
}

// publishedSecrets are AUTH_SECRET values that appear, or once appeared, in this repository
// (compose file, documentation, tests): anyone can read them, so none may sign a real token, nor
// open the support desk (ADMIN_TOKEN). TestPublishedSecretsAreRefused checks that every secret
// written in the repository is here; tests make theirs at random.
var publishedSecrets = []string{
	"dev-only-secret-change-me-0123456789abcdef",
	"test-secret-test-secret-test-secret!",
	"fleet-secret-fleet-secret-fleet-secret",
	"0123456789abcdef0123456789abcdef",
	"another-secret-another-secret-xx",
	"ssssssssssssssssssssssssssssssss",
	"0f1e2d3c4b5a69788796a5b4c3d2e1f0",       // once a test's example of an acceptable secret
	"a-desk-token-of-at-least-32-bytes-long", // once a test's ADMIN_TOKEN
}

// checkSecret refuses a short or published AUTH_SECRET, and an empty one with a shared Redis.
// The value never appears in a message.
func (cfg *environment) checkSecret(p *problems) {
	switch {
	case cfg.AuthSecret != "" && len(cfg.AuthSecret) < 32:
		p.add("AUTH_SECRET", "%d bytes: want at least 32 random bytes (openssl rand -base64 48)", len(cfg.AuthSecret))
	case published(cfg.AuthSecret):
		p.add("AUTH_SECRET", "this value is, or contains, one published in pixlimit's repository: anyone could sign "+
			"tokens with it; make your own (openssl rand -base64 48)")
	case cfg.AuthSecret != "" && (entropyBits(cfg.AuthSecret) < minSecretBits || periodic(cfg.AuthSecret)):
		p.add("AUTH_SECRET", "too predictable (a repeated string, or about %.0f bits by its letters' frequencies, want "+
			"%d; 32 hex digits count short of it): make it random and longer (openssl rand -base64 48)", entropyBits(cfg.AuthSecret), minSecretBits)
	case cfg.AuthSecret == "" && cfg.redisModes() > 0:
		// Each replica would draw its own: tokens would not cross replicas, and every limit would
		// be multiplied by the number of replicas, since each keys Redis with its own hash.
		p.add("AUTH_SECRET", "required with a shared Redis (REDIS_URL, REDIS_CLUSTER_ADDRS or REDIS_SENTINEL_ADDRS): "+
			"every replica must use the same one (openssl rand -base64 48)")
	}
}

// checkAdmin checks the support desk's listener and token: off unless ADMIN_ADDR is set, then on
// its own address, never HTTP_ADDR's, with an ADMIN_TOKEN of at least 32 random bytes that was
// never published (the same checks as AUTH_SECRET's) and is not AUTH_SECRET itself.
func (cfg *environment) checkAdmin(p *problems) {
	switch {
	case cfg.AdminAddr == "":
		if cfg.AdminToken != "" {
			p.add("ADMIN_TOKEN", "set without ADMIN_ADDR: the support desk is off; set both, or neither")
		}
		return
	case !listenAddr(cfg.AdminAddr):
		p.add("ADMIN_ADDR", "%q is not host:port with a port from 0 to 65535", cfg.AdminAddr)
	case sameListener(cfg.AdminAddr, cfg.HTTPAddr):
		p.add("ADMIN_ADDR", "%q is HTTP_ADDR's: the support desk never answers on the public listener", cfg.AdminAddr)
	case sameListener(cfg.AdminAddr, cfg.MetricsAddr):
		p.add("ADMIN_ADDR", "%q is METRICS_ADDR's: each listener needs an address of its own", cfg.AdminAddr)
	}
	switch t := cfg.AdminToken; {
	case len(t) < 32:
		p.add("ADMIN_TOKEN", "%d bytes: want at least 32 random bytes (openssl rand -base64 48)", len(t))
	case published(t):
		p.add("ADMIN_TOKEN", "this value is, or contains, one published in pixlimit's repository; make your own (openssl rand -base64 48)")
	case entropyBits(t) < minSecretBits || periodic(t):
		p.add("ADMIN_TOKEN", "too predictable: make it random (openssl rand -base64 48)")
	case t == cfg.AuthSecret:
		p.add("ADMIN_TOKEN", "equals AUTH_SECRET: the support desk's token must be a secret of its own")
	}
}

// sameListener says whether listening on a and on b would take the same port of one address (a
// host left empty, 0.0.0.0 or :: is every address of its kind): the second listener would fail
// to start. Port 0 is any free port, never the same.
func sameListener(a, b string) bool {
	ha, pa, erra := net.SplitHostPort(a)
	hb, pb, errb := net.SplitHostPort(b)
	every := func(h string) bool { return h == "" || h == "0.0.0.0" || h == "::" }
	return erra == nil && errb == nil && pa == pb && pa != "0" && (ha == hb || every(ha) || every(hb))
}

// listenAddr reports whether addr is what net.Listen takes: a host (or none) and a numeric port.
func listenAddr(addr string) bool {
	_, port, err := net.SplitHostPort(addr)
	n, perr := strconv.Atoi(port)
	return err == nil && perr == nil && n >= 0 && n <= 65535
}

// Public ranges in TRUSTED_PROXIES may be no wider than these: a proxy fleet's addresses, a CDN's
// published edge ranges included (the widest of Cloudflare's are a /13 and a /29), but no
// sizeable share of the internet (a /8 is one 256th of IPv4).
const (
	widestPublicProxyV4 = 12
	widestPublicProxyV6 = 28
)

// nonPublic are the ranges no client on the internet can come from: private, loopback,
// link-local, shared (carrier-grade NAT) and unique-local. A trusted proxy may be anywhere in
// them.
var nonPublic = []netip.Prefix{
	netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("172.16.0.0/12"), netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("169.254.0.0/16"), netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("::1/128"), netip.MustParsePrefix("fe80::/10"), netip.MustParsePrefix("fc00::/7"),
}

// v4In6 are the IPv6 ranges that hold all of IPv4: IPv4-mapped addresses, NAT64's well-known
// prefix (RFC 6052), as which a translator shows IPv4 clients, and its local-use prefix (RFC
// 8215), within which a translator's own prefix may put IPv4 anywhere after it. A trusted range
// overlapping one is judged as the IPv4 range of its last 32 bits when it is a /96 or narrower,
// and as all of IPv4 when wider.
var v4In6 = []netip.Prefix{netip.MustParsePrefix("::ffff:0:0/96"), netip.MustParsePrefix("64:ff9b::/96"),
	netip.MustParsePrefix("64:ff9b:1::/48")}

// checkProxies refuses TRUSTED_PROXIES ranges that would trust the internet: a trusted peer's
// X-Forwarded-For is believed, so trusting every hop (0.0.0.0/0, or any wide public range) lets
// clients choose their own login IP key. A range inside the non-public ones is fine, and so is a
// public one no wider than a proxy fleet's (widestPublicProxyV4, widestPublicProxyV6). A range
// of IPv4 written in IPv6 (v4In6) is judged as the IPv4 range it holds, and one that holds a
// whole v4In6 range holds all of IPv4. It returns the ranges as peers are matched: an
// IPv4-mapped range as its IPv4 one (a peer's address is unmapped before it is matched).
func checkProxies(p *problems, prefixes []netip.Prefix) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(prefixes))
	for _, pfx := range prefixes {
		p4, wholeV4 := pfx, false
		for _, e := range v4In6 {
			switch {
			case !pfx.Overlaps(e):
			case pfx.Bits() < 96:
				wholeV4 = true
			default:
				b := pfx.Addr().As16()
				p4 = netip.PrefixFrom(netip.AddrFrom4([4]byte(b[12:])), pfx.Bits()-96)
			}
		}
		if pfx.Addr().Is4In6() && pfx.Bits() >= 96 {
			out = append(out, p4)
		} else {
			out = append(out, pfx)
		}
		private := slices.ContainsFunc(nonPublic, func(np netip.Prefix) bool {
			return np.Addr().Is4() == p4.Addr().Is4() && np.Bits() <= p4.Bits() && np.Contains(p4.Addr())
		})
		widest := widestPublicProxyV4
		if p4.Addr().Is6() {
			widest = widestPublicProxyV6
		}
		if wholeV4 || !private && p4.Bits() < widest {
			p.add("TRUSTED_PROXIES", "%s trusts public addresses that are no proxy of yours, and clients behind them "+
				"would choose their own rate-limit key: name your proxies' addresses (public ranges no wider than /%d, "+
				"/%d for IPv6; private ranges as wide as you like)", pfx, widestPublicProxyV4, widestPublicProxyV6)
		}
	}
	return out
}

// minSecretBits is the least AUTH_SECRET's letters must carry, by their frequencies: 48 random
// bytes in base64 count about 330, 64 random hex digits about 245; 32 times "a" none, "password"
// repeated about 2.75 a letter. The frequencies of a short draw understate it: 32 random hex
// digits (128 bits) count 92 to 127, so they are refused, as the message says.
const minSecretBits = 128

// entropyBits estimates a secret's entropy from its letters' frequencies (Shannon), times its
// length: a ceiling for random secrets, and low for repeated or few letters.
func entropyBits(s string) float64 {
	counts := map[rune]int{}
	n := 0
	for _, r := range s {
		counts[r]++
		n++
	}
	bits := 0.0
	for _, c := range counts {
		f := float64(c) / float64(n)
		bits -= f * math.Log2(f)
	}
	return bits * float64(n)
}

// periodic reports whether s is a shorter string repeated ("password" six times): its letters'
// frequencies then overstate its entropy.
func periodic(s string) bool {
	for period := 1; period <= len(s)/2; period++ {
		if s[period:] == s[:len(s)-period] {
			return true
		}
	}
	return false
}

// published reports whether secret is, or contains, a published one, ignoring case and
// surrounding space: a published value with a trailing newline or in capitals is as known.
func published(secret string) bool {
	s := strings.ToLower(strings.TrimSpace(secret))
	return slices.ContainsFunc(publishedSecrets, func(pub string) bool { return strings.Contains(s, strings.ToLower(pub)) })
}

// addrList parses comma-separated host:port addresses, each with a host and a numeric port.
func addrList(p *problems, name, list string) []string {
	var addrs []string
	for _, a := range strings.Split(list, ",") {
		if a = strings.TrimSpace(a); a == "" {
			continue
		}
		host, port, err := net.SplitHostPort(a)
		if n, perr := strconv.Atoi(port); err != nil || host == "" || perr != nil || n < 1 || n > 65535 {
			p.add(name, "%q is not host:port with a port from 1 to 65535", a)
			continue
		}
		addrs = append(addrs, a)
	}
	if list != "" && len(addrs) == 0 && !p.has(name) { // set, but to no address: not the embedded Redis
		p.add(name, "%q names no host:port", list)
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

// kind names what a variable of type t should hold, with the parser's reason when it has one.
func kind(t reflect.Type, err error) string {
	switch t {
	case reflect.TypeFor[time.Duration]():
		return "duration (like 100ms, 1m)"
	case reflect.TypeFor[*bool]():
		return "boolean (true or false)"
	case reflect.TypeFor[int]():
		return "integer"
	case reflect.TypeFor[[]netip.Prefix]():
		return "list of CIDRs (like 10.0.0.0/8,fd00::/8)"
	case reflect.TypeFor[slog.Level]():
		return "level: debug, info, warn or error"
	}
	var inner interface{ Unwrap() error }
	if errors.As(err, &inner) && inner.Unwrap() != nil {
		return fmt.Sprintf("value: %v", inner.Unwrap())
	}
	return fmt.Sprintf("value (%v)", err)
}
