// Package ratelimit owns pixlimit's rate limiting: policies, the algorithms and their Lua
// scripts, the Redis keys, and the Limiter that decides a request over one or several keys.
// Its state lives in Redis, so every replica enforces one limit together. It knows requests and
// keys, nothing of routes: a Decision, or an error wrapping ErrUnavailable, is all it answers,
// and what a caller makes of it (an answer to a client, a fail mode) is the caller's.
//
// The API is small: a Policy says what is counted, a Check names the identity counted, and a
// Limiter decides. AllowAll decides one request; Decide decides steps one after another,
// stopping at the first refusal: a request (AllowStep), an ask that takes nothing (AskStep), a
// cost of several tokens of a bucket (ChargeStep) or their refund (RefundStep), and the steps
// layers define (package slots' in-flight slots, package grants' vouchers). Forget clears
// a key, Key names it, Ready says whether decisions can be made now, and Stats tells what it
// did. A Limiter starts nothing in the background: there is nothing to close.
//
// # What is not here
//
// Each production layer is a package around this one, which this one never imports, whose
// documentation opens with what it buys and what it costs: batch, breaker, withdraw (late
// answers, and a Redis Cluster's split decisions), denycache, outages, queue, fallback,
// sequence, slots, grants and warm. A Limiter reaches Redis through a Runner (Options.Runner),
// a SequenceRunner (Options.Sequences) and the client it is given, and is a Decider a layer may
// stand in front of, so an application takes the layers it wants: internal/app shows the stack.
//
// # The sliding-window log
//
// A policy admits at most Limit requests per identity in any interval of length Window. Each
// identity has a Redis sorted set, named by a keyed hash of the identity so that no CPF or IP is
// stored in clear (keys.go), holding one entry per admitted request, scored by the time it was
// admitted. To decide a request at time now, the script (sliding_log.lua) drops the entries
// scored at or before now-Window, counts what is left and, only if the count is below Limit,
// adds an entry for this request. That is the whole algorithm, and it is exact: the count is the
// number of admissions in the last Window, not an estimate.
//
// There is no 2× burst at a window boundary, because there is no boundary. A fixed window (one
// counter per calendar minute) lets a client spend its limit at 12:00:59 and again at 12:01:00:
// twice the limit in two seconds. Here the window ends wherever now is, so the requests admitted
// at 12:00:59 stay counted until 12:01:59 (TestNoBoundaryBurst checks every such interval of a
// long random run). The price is memory: one entry per admitted request, where a counter costs one
// number (docs/benchmarks-history.md has the bytes per key of every algorithm).
//
// # One script, one round trip, one clock
//
// Counting and recording happen in one Lua script because Redis runs a script alone: no other
// decision, from any replica, can slip between "9 requests counted" and "10th recorded". A
// read-then-write from Go (ZCARD, then ZADD) would let two replicas both read 9 and both write.
// The script is sent once and then run by its SHA1 (EVALSHA, falling back to EVAL), so a decision
// is one round trip. Each redis.call inside costs about a microsecond of bridging, so the script
// issues only what the answer needs.
//
// The time is read inside the script from Redis TIME, never from the replica: replicas' clocks
// drift, and a replica running 2 seconds fast would otherwise expire other replicas' entries
// early. (Tests inject time, Options.Now, so they step through windows without sleeping.) Every
// script Redis runs is a .lua file, byte for byte: the algorithms' are in this directory, a
// layer's in its package (scripts.go says how they are made).
//
// # Refused requests are not recorded
//
// A refused request adds nothing, so a client that insists while blocked does not push its own
// unblocking later: RetryAfter is the time until the oldest counted entry leaves the window, and
// hammering does not move it. Every admission gets a unique member (a random 72-bit request id),
// so two requests in the same microsecond are two entries. Every key gets a TTL of one Window each
// time an entry is added: the key lives exactly as long as it has something to count.
//
// # Several keys in one decision
//
// The login limits the client IP and the account document at once. AllowAll decides all checks
// in one script: the request is admitted only if every key has room, and is then recorded in
// every key; if any key is full it is recorded in none, so a refusal consumes nobody's quota.
// Decision.Worst is the key to report (least Remaining; on a tie the longer Reset): a refusal by
// either key has the same shape, and Worst names the key that refused.
//
// In Redis Cluster, keys in different hash slots cannot share a script (CROSSSLOT): a cluster
// client needs a Runner that decides each key apart and withdraws what a refused decision's other
// keys admitted (package withdraw's).
//
// # When Redis cannot answer
//
// Each decision has a budget (Options.Timeout, and ClientOptions for the client), so no request
// waits longer. Past it, AllowAll returns an error wrapping ErrUnavailable and the caller decides
// without a decision: refuse (a password or a money route, where no limit is the bigger risk) or
// serve (where refusing is the bigger harm). go-redis redials by itself and decisions resume.
//
// # Other algorithms
//
// Policy.Algorithm selects one of the others (algorithm.go says what each trades; each script's
// header, what its Remaining and Reset mean), with the same contract: the Redis clock, one atomic
// decision over any number of keys, refusals never recorded, the same Result and keys hashed
// alike (keys.go). Tests hold every meter (all but LeakyBucket, the queue) to a TTL no longer
// than its key is needed (the packed log's: up to a quarter window more) (TestEveryAlgorithmKeepsTTLs), an exact RetryAfter
// (TestRetryAfterIsExact), and a pure-Go model in model_test.go driven beside its script through
// thousands of random steps.
package ratelimit
