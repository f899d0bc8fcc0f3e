package config

import (
	"crypto/rand"
	mrand "math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pixlimit/pixlimit/internal/enforce"
	"github.com/pixlimit/pixlimit/internal/ratelimit"
)

func load(env map[string]string) (Config, error) {
	return Load(Map(env))
}

func TestDefaults(t *testing.T) {
	t.Parallel()
	cfg, err := load(nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]enforce.RouteLimit{
		"pix":           {Policy: ratelimit.Policy{Name: "pix", Limit: 10, Window: time.Minute, Algorithm: ratelimit.SlidingLog}, FailMode: enforce.FailClosed},
		"statement":     {Policy: ratelimit.Policy{Name: "statement", Limit: 30, Window: time.Minute, Algorithm: ratelimit.SlidingLog}, FailMode: enforce.FailFallback},
		"login-ip":      {Policy: ratelimit.Policy{Name: "login-ip", Limit: 10, Window: 10 * time.Minute, Algorithm: ratelimit.SlidingLog}, FailMode: enforce.FailClosed},
		"login-account": {Policy: ratelimit.Policy{Name: "login-account", Limit: 5, Window: 10 * time.Minute, Algorithm: ratelimit.SlidingLog}, FailMode: enforce.FailClosed},
		"account-settings": {Policy: ratelimit.Policy{Name: "account-settings", Limit: 20, Window: time.Minute, Algorithm: ratelimit.SlidingLog},
			FailMode: enforce.FailClosed},
	}
	for _, got := range []enforce.RouteLimit{cfg.Limits.PIX, cfg.Limits.Statement, cfg.Limits.LoginIP, cfg.Limits.LoginAccount, cfg.Limits.Settings} {
		if got != want[got.Policy.Name] {
			t.Errorf("policy %s = %+v, want %+v", got.Policy.Name, got, want[got.Policy.Name])
		}
	}
	if cfg.HTTPAddr != ":8080" || cfg.MaxConnections != 10_000 || cfg.RedisTimeout != 100*time.Millisecond || cfg.TokenTTL != 15*time.Minute ||
		cfg.Limits.FailClosedRetryAfter != 5*time.Second || !cfg.DemoAccounts || cfg.LogFormat != "text" || cfg.Redis.URL != nil {
		t.Errorf("defaults = %+v", cfg)
	}
}

// TestTheMoneyDefaults: with nothing set, the ledger holds the rules a real bank must
// (docs/rules.md): R$ 1.000,00 a night between persons from 20:00 to 06:00 São Paulo time,
// R$ 200,00 a transfer and R$ 1.000,00 a day from a device not registered, a raise in force 24
// hours after it is asked; and the bank's own: a new device registered a day later, a day limit
// of R$ 10.000,00 (api.md). Every other test sets these; only this one sees a default change.
func TestTheMoneyDefaults(t *testing.T) {
	t.Parallel()
	cfg, err := load(nil)
	if err != nil {
		t.Fatal(err)
	}
	m := cfg.Money
	type money struct {
		night, newTransfer, newDay, day int64
		start, end, raise, register     time.Duration
		zone                            string
	}
	got := money{m.Night.LimitCents, m.NewDeviceTransferCents, m.NewDeviceDayCents, m.DayLimitCents,
		m.Night.Start, m.Night.End, m.IncreaseDelay, cfg.DeviceRegistrationDelay, ""}
	if m.Night.Location != nil {
		got.zone = m.Night.Location.String()
	}
	want := money{100_000, 20_000, 100_000, 1_000_000, 20 * time.Hour, 6 * time.Hour, 24 * time.Hour, 24 * time.Hour, "America/Sao_Paulo"}
	if got != want {
		t.Errorf("money defaults = %+v, want %+v", got, want)
	}
}

// TestLookUpDefaultsAreDICTs: the payer buckets hold 100 for a person, refilled 2 a minute, and
// 1,000 for a company, refilled 20 a minute; the bank's bucket follows DICT's table for its
// category (D by default; Manual Operacional do DICT, §13.1), and either figure can be set apart.
func TestLookUpDefaultsAreDICTs(t *testing.T) {
	t.Parallel()
	bucket := func(name string, refill, capacity int) enforce.RouteLimit {
		return enforce.RouteLimit{Policy: ratelimit.Policy{Name: name, Limit: refill, Window: time.Minute, Algorithm: ratelimit.TokenBucket, Burst: capacity}}
	}
	for _, tc := range []struct {
		env                 map[string]string
		pf, pj, participant enforce.RouteLimit
		category            string
	}{
		{nil, bucket("pix-lookup", 2, 100), bucket("pix-lookup", 20, 1000), bucket("pix-lookup-participant", 8000, 16000), "D"},
		{map[string]string{"LOOKUP_PARTICIPANT_CATEGORY": "A"}, bucket("pix-lookup", 2, 100), bucket("pix-lookup", 20, 1000),
			bucket("pix-lookup-participant", 25000, 50000), "A"},
		{map[string]string{"LOOKUP_PARTICIPANT_CATEGORY": "H", "LOOKUP_PARTICIPANT_CAPACITY": "10", "LOOKUP_CAPACITY_PJ": "300",
			"LOOKUP_REFILL_PER_MINUTE_PJ": "5"},
			bucket("pix-lookup", 2, 100), bucket("pix-lookup", 5, 300), bucket("pix-lookup-participant", 2, 10), "H"},
		{map[string]string{"LOOKUP_PARTICIPANT_CATEGORY": "G"}, bucket("pix-lookup", 2, 100), bucket("pix-lookup", 20, 1000),
			bucket("pix-lookup-participant", 25, 250), "G"},
	} {
		cfg, err := load(tc.env)
		if err != nil {
			t.Fatal(err)
		}
		l := cfg.Limits
		if l.PIXLookup != tc.pf || l.PIXLookupPJ != tc.pj || l.LookupParticipant != tc.participant || l.LookupCategory != tc.category ||
			l.LookupMissCost != 20 || l.LookupParticipantMissCost != 3 {
			t.Errorf("%v: %+v", tc.env, l)
		}
	}
}

func TestValidValues(t *testing.T) {
	t.Parallel()
	cfg, err := load(map[string]string{
		"REDIS_URL": "redis://:pw@10.0.0.5:6380/2", "TRUSTED_PROXIES": "10.0.0.0/8, fd00::/8",
		"PIX_LIMIT": "3", "PIX_WINDOW": "30s", "STATEMENT_FAIL_MODE": "closed", "LOG_LEVEL": "debug", "LOG_FORMAT": "json",
		"AUTH_SECRET": rand.Text() + rand.Text(), "DEMO_ACCOUNTS": "false",
	})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Redis.URL == nil || cfg.Redis.URL.Addr != "10.0.0.5:6380" || cfg.Redis.URL.DB != 2 {
		t.Errorf("REDIS_URL parsed as %+v", cfg.Redis.URL)
	}
	if len(cfg.TrustedProxies) != 2 || cfg.TrustedProxies[1].String() != "fd00::/8" {
		t.Errorf("TRUSTED_PROXIES parsed as %v", cfg.TrustedProxies)
	}
	if cfg.Limits.PIX.Policy.Limit != 3 || cfg.Limits.PIX.Policy.Window != 30*time.Second || cfg.Limits.Statement.FailMode != enforce.FailClosed || cfg.DemoAccounts {
		t.Errorf("parsed %+v", cfg)
	}
}

// TestValuesThatCouldMeanSomethingElse: trusted-proxy ranges that trust the internet, listen
// addresses whose port is no number, and secrets that are weak or a published one in disguise
// are refused, each named.
func TestValuesThatCouldMeanSomethingElse(t *testing.T) {
	t.Parallel()
	published := "dev-only-secret-change-me-0123456789abcdef"
	for _, tt := range []struct {
		name, value string
		ok          bool
	}{
		{"TRUSTED_PROXIES", "0.0.0.0/0,::/0", false},
		{"TRUSTED_PROXIES", "::/0", false},
		{"TRUSTED_PROXIES", "8.0.0.0/8", false},
		{"TRUSTED_PROXIES", "10.0.0.0/8, 1.0.0.0/1", false},
		{"TRUSTED_PROXIES", "2001:db8::/27", false},
		{"TRUSTED_PROXIES", "8.0.0.0/11", false},
		{"TRUSTED_PROXIES", "::ffff:0.0.0.0/96", false},
		{"TRUSTED_PROXIES", "64:ff9b::/96", false},          // NAT64: every IPv4 client, translated
		{"TRUSTED_PROXIES", "64:ff9b::/64", false},          // holds it
		{"TRUSTED_PROXIES", "64:ff9b::808:0/107", false},    // 8.0.0.0/11, translated
		{"TRUSTED_PROXIES", "64:ff9b::a00:0/104", true},     // 10.0.0.0/8, translated
		{"TRUSTED_PROXIES", "::ffff:203.0.113.0/120", true}, // 203.0.113.0/24, mapped
		{"TRUSTED_PROXIES", "64:ff9b:1::/48", false},        // NAT64's local use: IPv4 anywhere after it
		{"TRUSTED_PROXIES", "64:ff9b:1:2::/64", false},
		{"TRUSTED_PROXIES", "64:ff9b:1::a00:0/104", true}, // 10.0.0.0/8, in the /96 format
		{"TRUSTED_PROXIES", "10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, fd00::/8, 127.0.0.1/32", true},
		{"TRUSTED_PROXIES", "203.0.113.0/24, 198.51.100.7/32, 2001:db8:1::/48", true},
		// A CDN's published edge ranges (Cloudflare's, among them its widest): its proxies.
		{"TRUSTED_PROXIES", "173.245.48.0/20, 104.16.0.0/13, 172.64.0.0/13, 2400:cb00::/32, 2a06:98c0::/29", true},
		{"METRICS_ADDR", "127.0.0.1:notaport", false},
		{"METRICS_ADDR", ":99999", false},
		{"METRICS_ADDR", "127.0.0.1:0", true},
		{"HTTP_ADDR", "localhost:http", false},
		{"HTTP_MAX_CONNECTIONS", "0", false},
		{"HTTP_MAX_CONNECTIONS", "1", true},
		{"HTTP_MAX_CONNECTIONS", "1000001", false},
		{"AUTH_SECRET", strings.Repeat("a", 32), false},
		{"AUTH_SECRET", strings.Repeat("password", 6), false},
		{"AUTH_SECRET", published + " ", false},
		{"AUTH_SECRET", strings.ToUpper(published), false},
		{"AUTH_SECRET", "x" + published, false},
		{"AUTH_SECRET", rand.Text() + rand.Text(), true},
		{"AUTH_SECRET", hexTwice(), true}, // 32 hex digits, each twice: 128 bits by their frequencies
	} {
		env := map[string]string{tt.name: tt.value}
		if tt.name != "AUTH_SECRET" {
			env["AUTH_SECRET"] = rand.Text() + rand.Text()
		}
		_, err := load(env)
		if got := err == nil; got != tt.ok {
			t.Errorf("%s=%q: error %v, want ok %t", tt.name, tt.value, err, tt.ok)
		}
		if err != nil && !strings.Contains(err.Error(), tt.name+":") {
			t.Errorf("%s=%q: error %v does not name %s", tt.name, tt.value, err, tt.name)
		}
		if err != nil && tt.name == "AUTH_SECRET" && strings.Contains(err.Error(), tt.value) {
			t.Errorf("the error shows AUTH_SECRET's value: %v", err)
		}
	}
}

// TestEveryAnswerFitsInTheWriteTimeout: a DB_TIMEOUT whose longest PIX (its statements, its
// COMMIT, the look-up of an unknown outcome, its limiter decisions) cannot be answered within
// the server's write timeout is refused, named; the client would otherwise get no answer at all.
func TestEveryAnswerFitsInTheWriteTimeout(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		db, redis string
		ok        bool
	}{
		{"2s", "100ms", true},
		{"6s", "100ms", true},  // 2×0.1 + 2×6 + 1 = 13.2 s
		{"7s", "100ms", false}, // 15.2 s
		{"30s", "100ms", false},
		{"5s", "1s", true},  // 2 + 10 + 1 = 13 s
		{"6s", "1s", false}, // 15 s
	} {
		cfg, err := load(map[string]string{"DB_TIMEOUT": tt.db, "REDIS_TIMEOUT": tt.redis})
		if got := err == nil; got != tt.ok {
			t.Errorf("DB_TIMEOUT=%s REDIS_TIMEOUT=%s: error %v, want ok %t", tt.db, tt.redis, err, tt.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "DB_TIMEOUT:") {
			t.Errorf("DB_TIMEOUT=%s: error %v does not name DB_TIMEOUT", tt.db, err)
		}
		if err == nil && cfg.LongestRequest() > WriteTimeout-writeMargin {
			t.Errorf("DB_TIMEOUT=%s accepted, but its longest request %v does not fit", tt.db, cfg.LongestRequest())
		}
	}
	// On a cluster a PIX's steps are calls of their own, its in-flight slot's two (taken, given
	// back), its mark's two and its price's four (two buckets, taken and given back) among them:
	// 12 × 1 + 10 + 1 = 23 s.
	if _, err := load(map[string]string{"DB_TIMEOUT": "5s", "REDIS_TIMEOUT": "1s", "REDIS_CLUSTER_ADDRS": "10.0.0.1:7000",
		"AUTH_SECRET": strings.Repeat("s", 32)}); err == nil || !strings.Contains(err.Error(), "12 limiter decisions") {
		t.Errorf("DB_TIMEOUT=5s REDIS_TIMEOUT=1s on a cluster: error %v, want DB_TIMEOUT refused for 12 limiter decisions", err)
	}
}

func TestEveryInvalidVariableIsNamed(t *testing.T) {
	t.Parallel()
	bad := map[string]string{
		"HTTP_ADDR":                            "8080",
		"HTTP_MAX_CONNECTIONS":                 "-1",
		"REDIS_URL":                            "http://redis:6379",
		"DATABASE_URL":                         "mysql://db/pixlimit",
		"DB_TIMEOUT":                           "1ms",
		"METRICS_ADDR":                         "127.0.0.1:notaport",
		"PIX_MODE":                             "observe",
		"REDIS_TIMEOUT":                        "soon",
		"AUTH_SECRET":                          "short",
		"TOKEN_TTL":                            "0s",
		"TRUSTED_PROXIES":                      "10.0.0.0/8,not-a-cidr",
		"PIX_LIMIT":                            "0",
		"PIX_WINDOW":                           "1500ms",
		"PIX_FAIL_MODE":                        "maybe",
		"STATEMENT_LIMIT":                      "many",
		"STATEMENT_WINDOW":                     "0s",
		"STATEMENT_FAIL_MODE":                  "OPEN",
		"LOGIN_IP_LIMIT":                       "-1",
		"LOGIN_ACCOUNT_LIMIT":                  "0",
		"LOGIN_WINDOW":                         "500ms",
		"LOGIN_FAIL_MODE":                      "",
		"FAIL_CLOSED_RETRY_AFTER":              "0s",
		"DEMO_ACCOUNTS":                        "yes please",
		"LOG_LEVEL":                            "loud",
		"LOG_FORMAT":                           "xml",
		"PIX_ALGORITHM":                        "leaky",
		"STATEMENT_BURST":                      "5", // with the default sliding_log
		"LOGIN_BURST":                          "0",
		"NIGHT_START":                          "06:00", // equal to NIGHT_END: a night of no length
		"RATELIMIT_BATCH_MAX":                  "0",
		"RATELIMIT_FLEET_SIZE":                 "0",
		"LOOKUP_CAPACITY_PJ":                   "0",
		"LOOKUP_PARTICIPANT_CATEGORY":          "I",
		"LOOKUP_REFILL_PER_MINUTE_PJ":          "0",
		"SETTINGS_LIMIT":                       "0",
		"LOOKUP_PARTICIPANT_CAPACITY":          "-5",
		"LOOKUP_PARTICIPANT_REFILL_PER_MINUTE": "-1",
		"RATELIMIT_DENY_CACHE_SIZE":            "-1",
	}
	for name, value := range bad {
		if value == "" {
			continue // empty means the default
		}
		env := map[string]string{name: value}
		if name != "AUTH_SECRET" {
			env["AUTH_SECRET"] = rand.Text() + rand.Text() // a shared Redis requires one
		}
		_, err := load(env)
		if err == nil || !strings.Contains(err.Error(), name+":") {
			t.Errorf("%s=%q: error %v, want one naming %s", name, value, err, name)
		}
		if strings.Count(err.Error(), "\n") != 1 {
			t.Errorf("%s=%q: error %q, want exactly one problem", name, value, err)
		}
	}
	_, err := load(bad)
	if err == nil {
		t.Fatal("all bad at once: no error")
	}
	for name, value := range bad {
		if value != "" && !strings.Contains(err.Error(), name+":") {
			t.Errorf("all bad at once: %s not named in\n%v", name, err)
		}
	}
	if strings.Contains(err.Error(), "short") {
		t.Errorf("the error shows AUTH_SECRET's value:\n%v", err)
	}
	for _, name := range []string{"STATEMENT_WINDOW", "LOGIN_WINDOW"} { // 0s and 500ms: told this variable's rule
		if !strings.Contains(err.Error(), name+": "+bad[name]+": want whole seconds, at least 1s") {
			t.Errorf("all bad at once: %s=%s not told it wants whole seconds:\n%v", name, bad[name], err)
		}
	}
	for range 20 { // one report, in one order, every time
		if _, again := load(bad); again.Error() != err.Error() {
			t.Fatalf("the same environment, two reports:\n%v\n---\n%v", err, again)
		}
	}
}

func TestAlgorithms(t *testing.T) {
	t.Parallel()
	cfg, err := load(map[string]string{"PIX_ALGORITHM": "token_bucket", "PIX_BURST": "25", "LOGIN_ALGORITHM": "gcra",
		"STATEMENT_ALGORITHM": "fixed_window"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Limits.PIX.Policy.Algorithm != ratelimit.TokenBucket || cfg.Limits.PIX.Policy.Burst != 25 || cfg.Limits.Statement.Policy.Algorithm != ratelimit.FixedWindow ||
		cfg.Limits.LoginIP.Policy.Algorithm != ratelimit.GCRA || cfg.Limits.LoginAccount.Policy.Algorithm != ratelimit.GCRA || cfg.Limits.LoginIP.Policy.Burst != 0 {
		t.Errorf("parsed %+v / %+v / %+v", cfg.Limits.PIX, cfg.Limits.Statement, cfg.Limits.LoginIP)
	}
}

func TestPolicyBeyondPrecision(t *testing.T) {
	t.Parallel()
	_, err := load(map[string]string{"STATEMENT_ALGORITHM": "sliding_window", "STATEMENT_LIMIT": "1000000000", "STATEMENT_WINDOW": "24h"})
	if err == nil || !strings.Contains(err.Error(), "STATEMENT_LIMIT:") {
		t.Errorf("err = %v, want STATEMENT_LIMIT named", err)
	}
}

func TestRedisModes(t *testing.T) {
	t.Parallel()
	secret := rand.Text() + rand.Text()
	cfg, err := load(map[string]string{"REDIS_CLUSTER_ADDRS": "10.0.0.1:7000, 10.0.0.2:7000", "AUTH_SECRET": secret})
	if err != nil || len(cfg.Redis.Cluster) != 2 || cfg.Redis.URL != nil {
		t.Errorf("cluster: %+v, %v", cfg.Redis.Cluster, err)
	}
	cfg, err = load(map[string]string{"REDIS_SENTINEL_ADDRS": "s1:26379,s2:26379,s3:26379", "REDIS_SENTINEL_MASTER": "mymaster", "AUTH_SECRET": secret})
	if err != nil || len(cfg.Redis.Sentinel) != 3 {
		t.Errorf("sentinel: %+v, %v", cfg.Redis.Sentinel, err)
	}
	for _, env := range []map[string]string{
		{"REDIS_URL": "redis://r:6379", "REDIS_CLUSTER_ADDRS": "10.0.0.1:7000"},
		{"REDIS_CLUSTER_ADDRS": "10.0.0.1:7000", "REDIS_SENTINEL_ADDRS": "s:26379", "REDIS_SENTINEL_MASTER": "m"},
		{"REDIS_SENTINEL_ADDRS": "s:26379"},
		{"REDIS_SENTINEL_MASTER": "m"},
		{"REDIS_CLUSTER_ADDRS": "10.0.0.1"},
		{"REDIS_CLUSTER_ADDRS": "10.0.0.1:redis"},
		{"REDIS_CLUSTER_ADDRS": "10.0.0.1:7000,10.0.0.2:0"},
		{"REDIS_CLUSTER_ADDRS": ":7000"},
		{"REDIS_SENTINEL_ADDRS": "s:65536", "REDIS_SENTINEL_MASTER": "m"},
		{"REDIS_SENTINEL_ADDRS": "s:-1", "REDIS_SENTINEL_MASTER": "m"},
	} {
		env["AUTH_SECRET"] = secret
		if _, err := load(env); err == nil {
			t.Errorf("%v: no error", env)
		}
	}
	// Two modes at once: each variable set is named, and none that is not.
	_, err = load(map[string]string{"REDIS_CLUSTER_ADDRS": "10.0.0.1:7000", "REDIS_SENTINEL_ADDRS": "s:26379",
		"REDIS_SENTINEL_MASTER": "m", "AUTH_SECRET": secret})
	if err == nil || !strings.Contains(err.Error(), "REDIS_CLUSTER_ADDRS: set with REDIS_SENTINEL_ADDRS:") ||
		!strings.Contains(err.Error(), "REDIS_SENTINEL_ADDRS: set with REDIS_CLUSTER_ADDRS:") || strings.Contains(err.Error(), "REDIS_URL:") {
		t.Errorf("cluster and sentinel: error %v, want both named, and REDIS_URL (unset) not", err)
	}
}

// TestRedisURLPasswordIsNotEchoed: no part of REDIS_URL's password is in its error, one the
// parser reads as a port or cuts at a / ? or # included (base64 passwords hold them).
func TestRedisURLPasswordIsNotEchoed(t *testing.T) {
	t.Parallel()
	for _, url := range []string{"redis://user:hunter2@host:notaport", "redis://:hunter2/w7Rt+Hs0pZ@redis:6379/0",
		"redis://:hunter2#w7Rt@redis:6379/0", "redis://:hunter2?w7Rt@redis:6379/0"} {
		_, err := load(map[string]string{"REDIS_URL": url, "AUTH_SECRET": rand.Text() + rand.Text()})
		if err == nil || strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "w7Rt") || !strings.Contains(err.Error(), "REDIS_URL: ") {
			t.Errorf("%s: err = %v, want REDIS_URL refused without a piece of its password", url, err)
		}
	}
}

// TestARedisListOfNoAddressIsAnError: a cluster's or sentinels' list set to commas or spaces is
// refused; read as unset, the replica would run the embedded Redis, its limits its own.
func TestARedisListOfNoAddressIsAnError(t *testing.T) {
	t.Parallel()
	for _, env := range []map[string]string{
		{"REDIS_CLUSTER_ADDRS": ","},
		{"REDIS_CLUSTER_ADDRS": " "},
		{"REDIS_SENTINEL_ADDRS": " , ", "REDIS_SENTINEL_MASTER": "mymaster"},
	} {
		env["AUTH_SECRET"] = rand.Text() + rand.Text()
		_, err := load(env)
		var name string
		for n := range env {
			if strings.HasSuffix(n, "_ADDRS") {
				name = n
			}
		}
		if err == nil || !strings.Contains(err.Error(), name+": ") {
			t.Errorf("%v: err = %v, want %s refused", env, err, name)
		}
	}
}

// TestEachOffendingVariableIsNamed: the variable an error names is one that is set, or one that
// exists: REDIS_TIMEOUT too long for the longest PIX is named (with DB_TIMEOUT), and a look-up
// bucket's capacity is LOOKUP_CAPACITY, not a LOOKUP_BURST no one can set.
func TestEachOffendingVariableIsNamed(t *testing.T) {
	t.Parallel()
	_, err := load(map[string]string{"REDIS_TIMEOUT": "5s"})
	if err == nil || !strings.Contains(err.Error(), "REDIS_TIMEOUT: 5s: a PIX could take") {
		t.Errorf("REDIS_TIMEOUT=5s: err = %v, want REDIS_TIMEOUT named", err)
	}
	_, err = load(map[string]string{"LOOKUP_CAPACITY": "-5", "LOOKUP_CAPACITY_PJ": "-5"})
	if err == nil || strings.Contains(err.Error(), "BURST") || !strings.Contains(err.Error(), "LOOKUP_CAPACITY: ") ||
		!strings.Contains(err.Error(), "LOOKUP_CAPACITY_PJ: ") {
		t.Errorf("LOOKUP_CAPACITY=-5: err = %v, want LOOKUP_CAPACITY and LOOKUP_CAPACITY_PJ named, no BURST", err)
	}
}

func TestAuthSecret(t *testing.T) {
	t.Parallel()
	own := rand.Text() + rand.Text()
	tests := []struct {
		name string
		env  map[string]string
		ok   bool
	}{
		{"embedded Redis, no secret: a random one, with a warning", nil, true},
		{"embedded Redis, own secret", map[string]string{"AUTH_SECRET": own}, true},
		{"shared Redis, own secret", map[string]string{"REDIS_URL": "redis://r:6379", "AUTH_SECRET": own}, true},
		{"too short", map[string]string{"AUTH_SECRET": own[:31]}, false},
		{"REDIS_URL without a secret", map[string]string{"REDIS_URL": "redis://r:6379"}, false},
		{"cluster without a secret", map[string]string{"REDIS_CLUSTER_ADDRS": "r:7000"}, false},
		{"sentinel without a secret", map[string]string{"REDIS_SENTINEL_ADDRS": "s:26379", "REDIS_SENTINEL_MASTER": "m"}, false},
	}
	for _, published := range publishedSecrets {
		tests = append(tests, struct {
			name string
			env  map[string]string
			ok   bool
		}{"published " + published[:8] + "...", map[string]string{"AUTH_SECRET": published}, false})
	}
	for _, tt := range tests {
		_, err := load(tt.env)
		if got := err == nil; got != tt.ok {
			t.Errorf("%s: err = %v, want ok=%v", tt.name, err, tt.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "AUTH_SECRET:") {
			t.Errorf("%s: %v does not name AUTH_SECRET", tt.name, err)
		}
		if s := tt.env["AUTH_SECRET"]; err != nil && s != "" && strings.Contains(err.Error(), s) {
			t.Errorf("%s: the error shows the secret", tt.name)
		}
	}
}

func TestDemoAccountsAreSeededIntoMemoryOnlyUnlessAsked(t *testing.T) {
	t.Parallel()
	const db = "postgres://u:p@db:5432/pixlimit"
	tests := []struct {
		env  map[string]string
		want bool
	}{
		{nil, true},
		{map[string]string{"DEMO_ACCOUNTS": "false"}, false},
		{map[string]string{"DATABASE_URL": db}, false},
		{map[string]string{"DATABASE_URL": db, "DEMO_ACCOUNTS": "true"}, true},
		{map[string]string{"DATABASE_URL": db, "DEMO_ACCOUNTS": "false"}, false},
	}
	for _, tt := range tests {
		cfg, err := load(tt.env)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.DemoAccounts != tt.want {
			t.Errorf("%v: DemoAccounts = %v, want %v", tt.env, cfg.DemoAccounts, tt.want)
		}
	}
}

func TestShadowMode(t *testing.T) {
	t.Parallel()
	cfg, err := load(map[string]string{"PIX_MODE": "shadow", "LOGIN_MODE": "shadow"})
	if err != nil {
		t.Fatal(err)
	}
	if l := cfg.Limits; !l.PIX.Shadow || l.Statement.Shadow || !l.LoginIP.Shadow || !l.LoginAccount.Shadow {
		t.Errorf("shadow: pix %v, statement %v, login %v/%v; want pix and both login keys", l.PIX.Shadow, l.Statement.Shadow, l.LoginIP.Shadow, l.LoginAccount.Shadow)
	}
}

// TestSupportDesk: off by default; on, it needs its own address and a strong token of its own.
func TestSupportDesk(t *testing.T) {
	t.Parallel()
	secret := rand.Text() + rand.Text()
	token := rand.Text() + rand.Text()
	cfg, err := load(map[string]string{"AUTH_SECRET": secret})
	if err != nil || cfg.AdminAddr != "" {
		t.Fatalf("by default: %q, %v; want the desk off", cfg.AdminAddr, err)
	}
	if cfg, err := load(map[string]string{"AUTH_SECRET": secret, "ADMIN_ADDR": "127.0.0.1:9000", "ADMIN_TOKEN": token}); err != nil ||
		cfg.AdminAddr != "127.0.0.1:9000" || cfg.AdminToken != token {
		t.Fatalf("on: %+v, %v", cfg, err)
	}
	for _, env := range []map[string]string{
		{"ADMIN_TOKEN": token},                                   // a token without the desk
		{"ADMIN_ADDR": "127.0.0.1:9000"},                         // the desk without a token
		{"ADMIN_ADDR": "127.0.0.1:9000", "ADMIN_TOKEN": "short"}, // a short one
		{"ADMIN_ADDR": "127.0.0.1:9000", "ADMIN_TOKEN": "dev-only-secret-change-me-0123456789abcdef"}, // a published one
		{"ADMIN_ADDR": "127.0.0.1:9000", "ADMIN_TOKEN": strings.Repeat("ab", 20)},                     // a predictable one
		{"ADMIN_ADDR": "127.0.0.1:9000", "ADMIN_TOKEN": secret},                                       // AUTH_SECRET again
		{"ADMIN_ADDR": ":8080", "ADMIN_TOKEN": token},                                                 // the public listener
		{"ADMIN_ADDR": "127.0.0.1:8080", "ADMIN_TOKEN": token},                                        // the public listener's port, on one of its addresses
		{"ADMIN_ADDR": "127.0.0.1:9464", "ADMIN_TOKEN": token},                                        // the metrics'
		{"ADMIN_ADDR": "9000", "ADMIN_TOKEN": token},                                                  // no port
	} {
		env["AUTH_SECRET"] = secret
		_, err := load(env)
		if err == nil || !strings.Contains(err.Error(), "ADMIN_") || strings.Count(err.Error(), "\n") != 1 {
			t.Errorf("%v: %v, want one problem naming ADMIN_ADDR or ADMIN_TOKEN", env, err)
		}
		if err != nil && strings.Contains(err.Error(), secret) {
			t.Errorf("%v: the error shows a secret", env)
		}
	}
}

// TestMetricsListenOnTheirOwn: METRICS_ADDR may not take HTTP_ADDR's port: the process would
// stop at its second listen, naming neither variable.
func TestMetricsListenOnTheirOwn(t *testing.T) {
	t.Parallel()
	secret := rand.Text() + rand.Text()
	for _, tc := range []struct {
		http, metrics string
		ok            bool
	}{
		{":8080", ":9464", true},
		{"127.0.0.1:8080", "127.0.0.2:8080", true},
		{":0", ":0", true},
		{":8080", ":8080", false},
		{":8080", "127.0.0.1:8080", false},
		{"[::1]:8080", "[::]:8080", false},
	} {
		_, err := load(map[string]string{"AUTH_SECRET": secret, "HTTP_ADDR": tc.http, "METRICS_ADDR": tc.metrics})
		if got := err == nil; got != tc.ok || err != nil && !strings.Contains(err.Error(), "METRICS_ADDR") {
			t.Errorf("HTTP_ADDR %q, METRICS_ADDR %q: %v, want ok %v (else a problem naming METRICS_ADDR)", tc.http, tc.metrics, err, tc.ok)
		}
	}
}

// TestThrottleSettings: a queue only where it may wait (the PIX and the statement), of places
// whose turns all come within the write timeout, at a pace of at least a millisecond; the
// in-flight limit and its lease in range. Each mistake is named; the defaults fit.
func TestThrottleSettings(t *testing.T) {
	t.Parallel()
	cfg, err := load(map[string]string{"PIX_ALGORITHM": "leaky_bucket", "STATEMENT_ALGORITHM": "leaky_bucket"})
	if err != nil {
		t.Fatal(err)
	}
	// A PIX every 6 s: one place (5 s hold no turn, and a queue has at least one); a statement
	// every 2 s: two.
	if got, want := [2]int{cfg.Limits.PIX.Policy.Queue, cfg.Limits.Statement.Policy.Queue}, [2]int{1, 2}; got != want {
		t.Errorf("default queues %v, want %v", got, want)
	}
	if got, want := cfg.Limits.PIXConcurrency.Policy.Limit, 2; got != want {
		t.Errorf("PIX_CONCURRENCY default %d, want %d", got, want)
	}
	for _, tt := range []struct {
		env  map[string]string
		name string
	}{
		{map[string]string{"LOGIN_ALGORITHM": "leaky_bucket"}, "LOGIN_ALGORITHM"},
		{map[string]string{"SETTINGS_ALGORITHM": "leaky_bucket"}, "SETTINGS_ALGORITHM"},
		{map[string]string{"STATEMENT_QUEUE": "5"}, "STATEMENT_QUEUE"}, // with the default sliding_log
		{map[string]string{"PIX_ALGORITHM": "leaky_bucket", "PIX_QUEUE": "100"}, "PIX_QUEUE"},
		{map[string]string{"PIX_ALGORITHM": "leaky_bucket", "PIX_QUEUE": "-1"}, "PIX_QUEUE"},
		{map[string]string{"PIX_ALGORITHM": "leaky_bucket", "PIX_LIMIT": "2000", "PIX_WINDOW": "1s"}, "PIX_LIMIT"},
		{map[string]string{"THROTTLE_MAX_WAITING": "0"}, "THROTTLE_MAX_WAITING"},
		{map[string]string{"PIX_CONCURRENCY": "-1"}, "PIX_CONCURRENCY"},
		{map[string]string{"CONCURRENCY_LEASE": "0s"}, "CONCURRENCY_LEASE"},
		{map[string]string{"CONCURRENCY_LEASE": "3s"}, "CONCURRENCY_LEASE"}, // shorter than the longest PIX, 5.3s
		{map[string]string{"PIX_ALGORITHM": "leaky_bucket", "PIX_QUEUE": "0"}, "PIX_QUEUE"},
		{map[string]string{"LOGIN_QUEUE": "5"}, "LOGIN_QUEUE"},
	} {
		_, err := load(tt.env)
		if err == nil || !strings.Contains(err.Error(), tt.name+":") {
			t.Errorf("%v: error %v, want it to name %s", tt.env, err, tt.name)
		}
	}
	if cfg, err := load(map[string]string{"PIX_CONCURRENCY": "0"}); err != nil || cfg.Limits.PIXConcurrency.Policy.Limit != 0 {
		t.Errorf("PIX_CONCURRENCY=0: %v, %v; want no in-flight limit", cfg.Limits.PIXConcurrency, err)
	}
	// Unset, the lease outlasts the longest PIX (13.3s with DB_TIMEOUT=6s), whole seconds up.
	if cfg, err := load(map[string]string{"DB_TIMEOUT": "6s"}); err != nil || cfg.Limits.PIXConcurrency.Policy.Window != 14*time.Second {
		t.Errorf("DB_TIMEOUT=6s: lease %v, %v; want 14s", cfg.Limits.PIXConcurrency.Policy.Window, err)
	}
	// Unset, a queue holds what fits in the wait: DB_TIMEOUT=5s leaves 14 − 11.3 = 2.7s, one
	// statement's turn of 2s (5s would hold two).
	if cfg, err := load(map[string]string{"DB_TIMEOUT": "5s", "STATEMENT_ALGORITHM": "leaky_bucket"}); err != nil || cfg.Limits.Statement.Policy.Queue != 1 {
		t.Errorf("DB_TIMEOUT=5s: statement queue %d, %v; want 1", cfg.Limits.Statement.Policy.Queue, err)
	}
}

// TestLedgerAccountShare: LEDGER_ACCOUNT_SHARE is 2 unless set, and must be from 1 to below the
// ledger's connections (pool_max_conns, or pgxpool's default of at least 4; the in-memory
// ledger's 64), so that one account never holds them all.
func TestLedgerAccountShare(t *testing.T) {
	const db = "postgres://u@localhost/pixlimit?pool_max_conns=4"
	for _, tt := range []struct {
		env  map[string]string
		want int // 0: a configuration error naming the variable
	}{
		{map[string]string{}, 2},
		{map[string]string{"DATABASE_URL": db}, 2},
		{map[string]string{"DATABASE_URL": db, "LEDGER_ACCOUNT_SHARE": "3"}, 3},
		{map[string]string{"DATABASE_URL": db, "LEDGER_ACCOUNT_SHARE": "4"}, 0},
		{map[string]string{"LEDGER_ACCOUNT_SHARE": "0"}, 0},
		{map[string]string{"LEDGER_ACCOUNT_SHARE": "63"}, 63},
		{map[string]string{"LEDGER_ACCOUNT_SHARE": "64"}, 0},
		{map[string]string{"LEDGER_ACCOUNT_SHARE": "4294967297"}, 0}, // 2³²+1: would wrap to 1 in 32 bits
	} {
		cfg, err := load(tt.env)
		switch {
		case tt.want == 0 && (err == nil || !strings.Contains(err.Error(), "LEDGER_ACCOUNT_SHARE")):
			t.Errorf("%v: error %v, want one naming LEDGER_ACCOUNT_SHARE", tt.env, err)
		case tt.want != 0 && (err != nil || cfg.LedgerAccountShare != tt.want):
			t.Errorf("%v: %d, %v; want %d", tt.env, cfg.LedgerAccountShare, err, tt.want)
		}
	}
}

// TestTheDenyCacheSizeAndItsFormerName: RATELIMIT_DENY_CACHE_SIZE sizes the deny cache (0: off);
// RATELIMIT_LOCAL_CACHE_SIZE, its name before wave 5, is still read while it is unset, and is
// reported as deprecated either way; when both are set, the new one wins. A problem names the
// variable the size was read from.
func TestTheDenyCacheSizeAndItsFormerName(t *testing.T) {
	t.Parallel()
	const former, name = "RATELIMIT_LOCAL_CACHE_SIZE", "RATELIMIT_DENY_CACHE_SIZE"
	read := []Deprecation{{Old: former, New: name}}
	ignored := []Deprecation{{Old: former, New: name, Ignored: true}}
	for _, tt := range []struct {
		env        map[string]string
		size       int // Config.DenyCacheSize: 0 is off
		deprecated []Deprecation
		problem    string // the variable an error names; empty: no error
	}{
		{nil, 100_000, nil, ""},
		{map[string]string{name: "500"}, 500, nil, ""},
		{map[string]string{name: "0"}, 0, nil, ""},
		{map[string]string{former: "700"}, 700, read, ""},
		{map[string]string{former: "0"}, 0, read, ""},
		{map[string]string{name: "", former: "700"}, 700, read, ""}, // set empty is unset
		{map[string]string{name: "500", former: "700"}, 500, ignored, ""},
		{map[string]string{name: "500", former: "-1"}, 500, ignored, ""},
		{map[string]string{name: "-1"}, 0, nil, name},
		{map[string]string{former: "-1"}, 0, nil, former},
		{map[string]string{former: "many"}, 0, nil, former},
		{map[string]string{name: "-1", former: "700"}, 0, nil, name},
	} {
		cfg, err := load(tt.env)
		switch {
		case tt.problem != "":
			if err == nil || !strings.Contains(err.Error(), tt.problem+":") || strings.Count(err.Error(), "\n") != 1 {
				t.Errorf("%v: error %v, want one problem, naming %s", tt.env, err, tt.problem)
			}
		case err != nil:
			t.Errorf("%v: %v", tt.env, err)
		case cfg.DenyCacheSize != tt.size || !slices.Equal(cfg.Deprecated, tt.deprecated):
			t.Errorf("%v: size %d, deprecated %+v; want %d, %+v", tt.env, cfg.DenyCacheSize, cfg.Deprecated, tt.size, tt.deprecated)
		}
	}
}

// TestUnknownVariablesAreNamed: a variable with one of the contract's prefixes that the
// configuration does not read (a misspelling) is named, once; known ones and other prefixes are not.
func TestUnknownVariablesAreNamed(t *testing.T) {
	got := Unknown([]string{"PIX_LIMIT_TYPO=5", "PIX_LIMIT=5", "LEDGER_ACCOUNT_SHARE=2", "LOGIN_QUEUE=3",
		"RATELIMIT_FLEET_SIZE=2", "REDIS_URLS=x", "HOME=/root", "PATH=/bin", "NEW_DEVICE_LIMIT=1", "PIX_LIMIT_TYPO=6"})
	want := []string{"NEW_DEVICE_LIMIT", "PIX_LIMIT_TYPO", "REDIS_URLS"}
	if !slices.Equal(got, want) {
		t.Errorf("Unknown: %v, want %v", got, want)
	}
	var all []string
	for _, name := range []string{"PIX_LIMIT", "PIX_WINDOW", "PIX_BURST", "PIX_QUEUE", "LOGIN_IP_LIMIT", "LOGIN_NET_LIMIT",
		"SETTINGS_LIMIT", "STATEMENT_FAIL_MODE", "DB_TIMEOUT", "DEVICE_TTL", "ADMIN_TOKEN", "METRICS_ADDR", "NIGHT_START",
		"DAY_LIMIT_CENTS", "NEW_DEVICE_TRANSFER_LIMIT_CENTS", "THROTTLE_MAX_WAITING", "CONCURRENCY_LEASE", "LOOKUP_CAPACITY",
		"RATELIMIT_DENY_CACHE_SIZE", "RATELIMIT_LOCAL_CACHE_SIZE"} { // the deprecated name is known: a warning of its own
		all = append(all, name+"=1")
	}
	if got := Unknown(all); len(got) != 0 {
		t.Errorf("Unknown of the contract's own variables: %v, want none", got)
	}
}

// hexTwice is the 16 hex digits twice, each time in a random order: a secret just strong enough
// by its letters' frequencies, made afresh (one written here would be published).
func hexTwice() string {
	digits := []byte("0123456789abcdef0123456789abcdef")
	mrand.Shuffle(16, func(i, j int) { digits[i], digits[j] = digits[j], digits[i] })
	mrand.Shuffle(16, func(i, j int) { digits[16+i], digits[16+j] = digits[16+j], digits[16+i] })
	return string(digits)
}

// TestANightEndsAtNoCustomersStart: NIGHT_END at a night start a customer may choose (20:00,
// 22:00) gives her night no length, voiding the limit she set: a configuration error, named.
func TestANightEndsAtNoCustomersStart(t *testing.T) {
	t.Parallel()
	for end, bad := range map[string]bool{"20:00": true, "22:00": true, "21:00": false, "06:00": false} {
		_, err := load(map[string]string{"NIGHT_END": end, "AUTH_SECRET": rand.Text() + rand.Text()})
		if got := err != nil && strings.Contains(err.Error(), "NIGHT_END:"); got != bad {
			t.Errorf("NIGHT_END=%s: error %v, want refused %v", end, err, bad)
		}
	}
}

// TestAMappedProxyRangeMatchesItsPeers: a trusted range written as IPv4-mapped IPv6 is kept as
// the IPv4 range it holds, since a peer's address is unmapped before it is matched: kept as
// written, it matched no peer, and the clients behind that proxy shared its one IP key.
func TestAMappedProxyRangeMatchesItsPeers(t *testing.T) {
	t.Parallel()
	cfg, err := load(map[string]string{"TRUSTED_PROXIES": "::ffff:203.0.113.0/120, 64:ff9b::a00:0/104", "AUTH_SECRET": rand.Text() + rand.Text()})
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24"), netip.MustParsePrefix("64:ff9b::a00:0/104")}
	if !slices.Equal(cfg.TrustedProxies, want) {
		t.Errorf("TRUSTED_PROXIES kept as %v, want %v", cfg.TrustedProxies, want)
	}
	if !cfg.TrustedProxies[0].Contains(netip.MustParseAddr("::ffff:203.0.113.9").Unmap()) {
		t.Error("a mapped proxy's peer, unmapped, is not in its range")
	}
}

// TestMoneyOffTheRulesIsNamed: each money rule set apart from the central bank's is named, for
// a warning at start; the defaults and a stricter bank are named nowhere.
func TestMoneyOffTheRulesIsNamed(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		env  map[string]string
		want []string // the variables named, in order
	}{
		{nil, nil},
		{map[string]string{"NIGHT_LIMIT_CENTS": "50000", "NEW_DEVICE_TRANSFER_LIMIT_CENTS": "10000", "LIMIT_INCREASE_DELAY": "48h"}, nil},
		{map[string]string{"NIGHT_START": "19:00", "NIGHT_END": "07:00"}, nil}, // a longer night: stricter
		{map[string]string{"NIGHT_START": "22:00"}, []string{"NIGHT_START=22:00, NIGHT_END=06:00"}},
		{map[string]string{"NIGHT_START": "20:00", "NIGHT_END": "05:00"}, []string{"NIGHT_START=20:00, NIGHT_END=05:00"}},
		{map[string]string{"NIGHT_LIMIT_CENTS": "0", "NEW_DEVICE_DAY_LIMIT_CENTS": "100001", "LIMIT_INCREASE_DELAY": "2h"},
			[]string{"NIGHT_LIMIT_CENTS=0", "NEW_DEVICE_DAY_LIMIT_CENTS=100001", "LIMIT_INCREASE_DELAY=2h0m0s"}},
		{map[string]string{"NEW_DEVICE_TRANSFER_LIMIT_CENTS": "0", "NIGHT_START": "21:00", "LIMIT_INCREASE_DELAY": "72h"},
			[]string{"NEW_DEVICE_TRANSFER_LIMIT_CENTS=0", "NIGHT_START=21:00, NIGHT_END=06:00", "LIMIT_INCREASE_DELAY=72h0m0s"}},
	} {
		cfg, err := load(tt.env)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, rule := range cfg.MoneyOffRules {
			name, _, _ := strings.Cut(rule, ": ")
			got = append(got, name)
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("%v: named %q, want %q", tt.env, cfg.MoneyOffRules, tt.want)
		}
	}
}
