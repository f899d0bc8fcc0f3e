package ratelimit

import (
	_ "embed"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Algorithm is how a policy counts. Every algorithm is one Lua script beside this file, decides
// one or several keys atomically with the Redis clock, never records a refused request, can
// withdraw an admission, and reports the same Result; they differ in memory, accuracy and what
// bursts they let through (see the package documentation).
type Algorithm string

// The algorithms.
const (
	// SlidingLog keeps one entry per admitted request: exact, no boundary burst, and an
	// admission can be withdrawn by its request id; memory grows with the limit. The default.
	SlidingLog Algorithm = "sliding_log"
	// SlidingLogPacked is SlidingLog's exact log, deciding identically, packed into one string
	// of 4-byte admission times per key: a decision is one GET and one SET whatever the limit,
	// and a key costs a few bytes per admission instead of a sorted-set entry. No request ids:
	// a late decision cannot be withdrawn (it stays counted, as with the counters). Windows
	// up to 28 minutes.
	SlidingLogPacked Algorithm = "sliding_log_packed"
	// SlidingWindow weighs the previous calendar window's count by how much of it the sliding
	// window still covers: two counters, no boundary burst for the classic attack, approximate.
	SlidingWindow Algorithm = "sliding_window"
	// FixedWindow counts per calendar window: one counter, and up to twice the limit across a
	// window boundary.
	FixedWindow Algorithm = "fixed_window"
	// TokenBucket refills Limit tokens per Window, continuously, up to Burst: bursts of Burst,
	// then the refill rate.
	TokenBucket Algorithm = "token_bucket"
	// GCRA is the leaky bucket as a meter: the decisions of a token bucket of the same Burst and
	// rate, from one number of state.
	GCRA Algorithm = "gcra"
	// LeakyBucket is the leaky bucket as a queue: one request leaves every Window / Limit, and
	// up to Queue wait for their turns, each holding a place of its own; past that, refused. An
	// admission comes with a Wait, and the caller holds the request until its turn (Limiter.Wait).
	// One key per decision; a place per waiter in a sorted set.
	LeakyBucket Algorithm = "leaky_bucket"
)

// Algorithms lists every algorithm, the default first, the queue last.
func Algorithms() []Algorithm {
	return []Algorithm{SlidingLog, SlidingLogPacked, SlidingWindow, FixedWindow, TokenBucket, GCRA, LeakyBucket}
}

// UnmarshalText parses an algorithm's name; "" is SlidingLog.
func (a *Algorithm) UnmarshalText(text []byte) error {
	if len(text) == 0 {
		*a = SlidingLog
		return nil
	}
	if _, ok := scripts[Algorithm(text)]; !ok {
		return fmt.Errorf("want one of %v", Algorithms())
	}
	*a = Algorithm(text)
	return nil
}

// keyTag names the algorithm in its keys. The packed log, whose point is a small key, takes two
// letters ("log, packed"): Redis keeps the name for every identity, and at limit 10 the name
// weighs about as much as the log.
func (a Algorithm) keyTag() string {
	if a == SlidingLogPacked {
		return "lp"
	}
	return string(a)
}

// Bursty reports whether the algorithm takes a Burst: a capacity distinct from the rate.
func (a Algorithm) Bursty() bool { return a == TokenBucket || a == GCRA }

var (
	//go:embed prelude.lua
	preludeLua string
	//go:embed args.lua
	argsLua string
	//go:embed sliding_log.lua
	slidingLogLua string
	//go:embed sliding_log_packed.lua
	slidingLogPackedLua string
	//go:embed sliding_window.lua
	slidingWindowLua string
	//go:embed fixed_window.lua
	fixedWindowLua string
	//go:embed token_bucket.lua
	tokenBucketLua string
	//go:embed gcra.lua
	gcraLua string
	//go:embed leaky_bucket.lua
	leakyBucketLua string
	//go:embed batch.lua
	batchLua string
)

// bodies are each algorithm's body: its stored format, for deciding and withdrawing alike.
// Each has two parts, split at eachDecision: its functions, made once per script call, then
// its decision, run once per request (prelude.lua).
var bodies = map[Algorithm]string{
	SlidingLog:       slidingLogLua,
	SlidingLogPacked: slidingLogPackedLua,
	SlidingWindow:    slidingWindowLua,
	FixedWindow:      fixedWindowLua,
	TokenBucket:      tokenBucketLua,
	GCRA:             gcraLua,
	LeakyBucket:      leakyBucketLua,
}

// scripts decide one request each: the shared prelude (the clock, the arguments, the reply), one
// call's arguments (args.lua), then the algorithm's body. They run with EVALSHA and fall back
// to EVAL on NOSCRIPT (redis.Script.Run), so after the first call on a server only a script's
// hash travels. Built once, never modified.
var scripts = scriptsOf(func(functions, decision string) string {
	return preludeLua + argsLua + functions + decision
})

// batchScripts decide several requests of one algorithm in one call: the same prelude and body,
// its functions made once and its decision wrapped in the function decide, which batch.lua calls
// for each member.
var batchScripts = scriptsOf(func(functions, decision string) string {
	return preludeLua + functions + "local function decide()\n" + decision + "\nend\n" + batchLua
})

// eachDecision is the line that ends a body's functions and starts its decision.
const eachDecision = "---- each decision:"

// scriptsOf builds one script per algorithm from its body's two parts.
func scriptsOf(source func(functions, decision string) string) map[Algorithm]*redis.Script {
	s := make(map[Algorithm]*redis.Script, len(bodies))
	for a, body := range bodies {
		s[a] = redis.NewScript(source(split(string(a), body)))
	}
	return s
}

// aloneBlock is the line that starts what only a body run by itself runs (redis-cli --eval):
// the prelude's locals made from its own arguments. It ends at eachDecision; split cuts it.
const aloneBlock = "---- alone:"

// split cuts the body of name into its functions and its decision, at eachDecision, leaving out
// its alone block, if it has one.
func split(name, body string) (functions, decision string) {
	i := strings.Index(body, "\n"+eachDecision)
	if i < 0 {
		panic("ratelimit: " + name + ".lua has no line " + eachDecision)
	}
	functions, decision = body[:i+1], body[i+1:]
	if a := strings.Index(functions, "\n"+aloneBlock); a >= 0 {
		functions = functions[:a+1]
	}
	return functions, decision
}
