// Package ratelimit owns pixlimit's rate limiting: the algorithm and its Lua script, the Redis
// keys, the decision over several keys, the RateLimit headers, the fail modes and the Echo
// middleware. Its state lives in Redis, so every API replica enforces one limit together.
//
// # The sliding-window log
//
// A policy admits at most Limit requests per identity in any interval of length Window. Each
// identity has a Redis sorted set holding one entry per admitted request, scored by the time it
// was admitted. To decide a request at time now, the script (sliding_log.lua) drops the entries
// scored at or before now-Window, counts what is left and, only if the count is below Limit,
// adds an entry for this request. That is the whole algorithm, and it is exact: the count is the
// number of admissions in the last Window, not an estimate.
//
// There is no 2× burst at a window boundary, because there is no boundary. A fixed window
// (one counter per calendar minute) lets a client spend its limit at 12:00:59 and again at
// 12:01:00: twice the limit in two seconds. Here the window ends wherever now is, so the 10
// requests admitted at 12:00:59 stay counted until 12:01:59, and any interval of one Window
// admits at most Limit (TestNoBoundaryBurst checks every such interval of a long random run).
//
// The price is memory: one entry per admitted request (about 30 bytes while a key holds
// up to 128 entries in Redis's compact listpack encoding: a full key at limit 10 costs 344 bytes,
// measured by TestMemoryPerKey with MEMORY USAGE), where a counter or GCRA costs one number. For
// limits in the tens, as a bank's login and transfers have, that is a good trade for exactness.
//
// # One script, one round trip, one clock
//
// Counting and recording happen in one Lua script because Redis runs a script alone: no other
// decision, from any replica, can slip between "9 requests counted" and "10th recorded". A
// read-then-write from Go (ZCARD, then ZADD) would let two replicas both read 9 and both write.
// The script is sent once and then run by its SHA1 (EVALSHA, falling back to EVAL when the server
// has not seen it), so a decision is one round trip.
//
// The time is read inside the script from Redis TIME, never from the replica: replicas' clocks
// drift, and a replica running 2 seconds fast would otherwise expire other replicas' entries
// early. One clock, the server's, makes every replica agree on what "the last Window" means.
// (Tests inject time through an unexported hook so they step through windows without sleeping.)
//
// # Refused requests are not recorded
//
// A refused request adds nothing, so a client that insists while blocked does not push its own
// unblocking later: Retry-After is the time until the oldest counted entry leaves the window,
// and hammering does not move it. This also means an attacker cannot use refused traffic to keep
// a key full forever; only admitted requests count.
//
// Every admission gets a unique member (a random 72-bit request id), so two requests in the same
// microsecond are two entries. The same id sent again (a retry of one request whose answer was
// lost) finds itself already recorded and is admitted without counting twice.
//
// Every key gets a TTL of one Window each time an entry is added; the newest entry outlives the
// others, so the key lives exactly as long as it has something to count and no key is ever left
// without a TTL.
//
// # Several keys in one decision
//
// The login limits the client IP and the account document at once. AllowAll decides all checks
// in one script: the request is admitted only if every key has room, and is then recorded in
// every key; if any key is full it is recorded in none, so a refusal consumes nobody's quota.
// The client is told about the worst key (least Remaining; on a tie the longer Reset), and
// RateLimit-Policy lists all of them, so a refusal by the IP key and one by the document key
// look the same.
//
// This works on a single Redis node, where any keys may share a script. In Redis Cluster, keys in
// different hash slots cannot: the IP key and the document key hash to different slots (each
// key's hash tag is its own identity), and one script over both fails with CROSSSLOT. With a
// cluster client (a *redis.ClusterClient, which New recognizes) a decision over several keys
// therefore runs one script per key, all at once, under one request id and one budget
// (cluster.go). If every key admits, the request is recorded everywhere, as on one node. If any
// refuses or cannot answer, undo.lua withdraws the admissions the others made (ZREM of the request
// id for the sliding log; the matching decrement, refund or schedule step for the counters),
// after the answer is sent. A refused request still consumes nothing in the end, and no key ever
// admits past its limit. The price is a window of imprecision on the strict side: until the
// withdrawal lands, the refused request holds one place in the keys that admitted it, and a
// concurrent request there can be refused. TestClusterExactness measures that hold under full
// load on a 2-core machine (192 goroutines, 6 Redis processes): p50 5 ms, p99 22 ms, max 50 ms,
// after 460,000 decisions with every key exact. It also costs throughput: a two-key decision on
// the cluster runs two scripts and sometimes a withdrawal (docs/benchmarks.md). go-redis follows
// MOVED and ASK itself; after a failed decision the limiter also asks it to reload the slot map,
// since a dead master redirects nobody (TestClusterFailover: 2.1 s of fail mode, then the promoted
// replica answers).
//
// # Keys
//
// A key is prefix:policy:{hash}, where hash is HMAC-SHA256 of the identity under a secret
// (Options.KeySecret), truncated to 128 bits. No CPF, account or IP appears in Redis in clear,
// and without the secret a dump cannot be reversed by hashing every possible CPF (there are only
// about 10^9). The braces are a Cluster hash tag. IPv6 clients are limited by their /64
// (IPIdentity), since one subscriber is usually given a whole /64.
//
// # When Redis cannot answer
//
// Each decision has a budget (Options.Timeout, REDIS_TIMEOUT): a context deadline covers the
// round trip, and ClientOptions bounds every dial, read, write and pool wait by it and disables
// retries, so no request waits longer than the budget for the limiter. Past the budget, each
// policy's FailMode answers: FailClosed refuses with 429 rate_limiter_unavailable and
// Retry-After of Options.FailClosedRetryAfter (login and PIX: an unlimited password or money
// route is the bigger risk); FailOpen serves the request without RateLimit headers (statement:
// refusing customers their balance is the bigger harm). Outages are logged per policy at most
// once per Options.OutageLogEvery, with how many failures were held back, and recovery is logged
// once. Nothing needs a restart: after Redis returns, go-redis redials within about a second
// (TestFailModes measures it) and decisions resume.
//
// # Late answers are withdrawn
//
// A decision that misses its budget was answered by the fail mode, but its script was sent: a
// slow or frozen Redis may run it afterwards and record a request that the client was told
// could not be decided. With the sliding log each admission is the request's own entry, so the
// limiter removes it by its id (undo.lua, ZREM) in the background, a few times over about
// 2.6 s in case the script runs after an attempt, at most 256 withdrawals at once, and Close
// waits for them. That is exact: ZREM of an id the script refused, or never ran, removes nothing.
// The counting algorithms (fixed and sliding window, token bucket, GCRA) store counts, not
// requests: they cannot tell whether this request was counted, and giving back a unit it did not
// take would admit past the limit. Their late admissions stay counted until they leave the
// window, on the strict side.
//
// # Other algorithms
//
// The sliding log is the default because it is exact. Policy.Algorithm selects one of the
// others, each its own commented script beside this file with the same contract: the Redis
// clock, one atomic decision over any number of keys, refusals never recorded, the same Result,
// headers and fail modes, and the same key hashing (keys of a non-default algorithm carry its
// name). Measured on this repository's benchmark machine (go test -run TestMemoryPerKey -v;
// go test -bench Decision; the bounds by the tests named):
//
//	algorithm       bytes/key        Redis µs per   burst it lets through        accuracy
//	                limit 10 / 1000  decision, p=16
//	sliding_log       344 / 100,224  12.4           none: ≤ limit in any window  exact
//	sliding_window    136 / 136       9.3           none for the boundary burst  ≤ 2 × limit in a window
//	                                                (TestBoundaryBursts)         (16 of 10 seen, bursty traffic)
//	fixed_window      120 / 136       8.5           2 × limit across a boundary  exact per calendar window
//	token_bucket      136 / 136       8.8           Burst at once, then the rate exact to the µs
//	gcra               88 / 88        8.8           Burst at once, then evenly   exact to the µs (float TAT)
//	redis_rate GCRA     — / —         8.2           (the peer, for scale)
//
// What each reports:
//
//   - sliding_log: Remaining = limit − requests in the last window; Reset = until the oldest of
//     them leaves it. Policy w = the window.
//   - sliding_window: Remaining = ⌊limit − estimate⌋ with estimate = previous × (W − elapsed)/W +
//     current; Reset = until the estimate has decayed enough for one more. w = the window. Worst
//     case 2 × limit in a window-length interval, when the previous window's traffic sat at its
//     very end (TestSlidingWindowErrorBound); exact when it was spread evenly.
//   - fixed_window: Remaining = limit − this calendar window's count; Reset = until the window
//     ends (aligned to the epoch). w = the window; it admits 2 × limit across a boundary
//     (TestBoundaryBursts shows the hole).
//   - token_bucket and gcra: RateLimit-Limit = Burst, Remaining = whole tokens left (requests
//     that fit now); Reset = until one more token; the policy says q=Limit;w=Window (the
//     sustained rate) plus burst=Burst. They decide identically for the same Burst and rate:
//     GCRA stores one number (the theoretical arrival time), the bucket two (tokens and time).
//
// Every key has a TTL, never longer than its algorithm needs the key: one window for the log and
// the fixed window, two for the sliding window (the previous count weighs during the next
// window), and the time to refill for the buckets (TestEveryAlgorithmKeepsTTLs).
//
// Retry-After is exact for every algorithm (TestRetryAfterIsExact): refused until it elapses,
// admitted when it has. Only the sliding log recognizes a retried request (its entries are
// request ids); the counters count a retry again. Each script has a pure-Go model in
// model_test.go that the tests drive alongside it through thousands of random steps.
//
// # Performance
//
// One decision is one EVALSHA. Each redis.call inside a script costs about a microsecond of
// bridging, more than most sorted-set commands themselves, so the sliding log issues only what
// the answer needs: it reads the oldest entry first (Reset needs it anyway) and prunes only when
// that entry has left the window, and it checks for a retried request only when a key is full
// (otherwise ZADD NX says so). Per key that is 4 commands on a new key (ZRANGE, ZADD, PEXPIRE,
// plus the one TIME), 5 on a busy one, 7 right after entries expire. Even so the log costs Redis
// 25–50% more time per decision than GCRA's GET and SET (the figure moves between runs on a
// shared machine): the price of exactness. docs/benchmarks.md has the figures against
// go-redis/redis_rate on the same server and the command that produced them.
package ratelimit
