// Package breaker stops asking a Redis that keeps failing: a client around the Redis client
// that a Limiter, and every layer around it, sends its scripts through.
//
// What it buys: a Redis that hangs costs each decision its whole budget (100 ms by default),
// and a replica whose every request waits that long before its fail mode answers is a replica
// that queues. After a few failed calls in a row the breaker opens and calls fail at once, so
// the routes' fail modes answer at once; it probes Redis in the background, and the first answer
// closes it. What it costs: while it is open, nothing asks Redis, so a Redis that came back is
// noticed only at the next probe (a cool-down, 1 s by default, or the next /readyz check); and
// one probe per cool-down. A Redis Cluster gets none: one master's failure fails only its slots,
// and a breaker for the whole client would turn it into an outage of every slot.
package breaker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pixlimit/pixlimit/internal/ratelimit"
)

// Options configure a Breaker. The zero value of each field but Probe has a default.
type Options struct {
	// Failures is how many calls failing in a row open the breaker: decisions, and the
	// Limiter's calls in the background (withdrawals, the heartbeat), which fail alike. Default 5.
	Failures int
	// Cooldown is how long an open breaker fails calls at once before it probes. Default 1s.
	Cooldown time.Duration
	// Timeout is a probe's budget. Default 100ms.
	Timeout time.Duration
	// Probe asks Redis whether it can decide, on the client the Breaker wraps (ratelimit.Probe:
	// a script that writes). Required.
	Probe func(ctx context.Context, rdb redis.Scripter) error
	// Logger receives the breaker's openings and closings. Default slog.Default().
	Logger *slog.Logger
}

// ErrOpen is the error of a call the open breaker failed without sending it: it wraps
// ratelimit.ErrNotSent, so the Limiter knows it did not run.
var ErrOpen = fmt.Errorf("circuit breaker open after consecutive failures: %w", ratelimit.ErrNotSent)

// Breaker is a Redis client that fails scripts at once while Redis keeps failing: its Eval,
// EvalSha, EvalRO and EvalShaRO go to the client it wraps while it is closed, and fail with
// ErrOpen while it is open. Everything else (Subscribe, Ping, ScriptLoad) goes through as is.
type Breaker struct {
	redis.UniversalClient
	state *breaker
	probe func(ctx context.Context, rdb redis.Scripter) error
	// shortCircuited counts the calls failed without asking Redis.
	shortCircuited atomic.Int64
}

// New returns a Breaker around rdb. Close stops its probes.
func New(rdb redis.UniversalClient, opts Options) (*Breaker, error) {
	if opts.Probe == nil {
		return nil, errors.New("breaker: no probe")
	}
	if opts.Failures < 0 || opts.Cooldown < 0 || opts.Timeout < 0 {
		return nil, errors.New("breaker: negative option")
	}
	b := &Breaker{UniversalClient: rdb, probe: opts.Probe}
	timeout := cmp.Or(opts.Timeout, 100*time.Millisecond)
	b.state = newBreaker(cmp.Or(opts.Failures, 5), cmp.Or(opts.Cooldown, time.Second), timeout,
		func(ctx context.Context) error { return opts.Probe(ctx, rdb) }, time.Now, cmp.Or(opts.Logger, slog.Default()))
	return b, nil
}

// Eval runs a script unless the breaker is open.
func (b *Breaker) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	return b.call(ctx, func() *redis.Cmd { return b.UniversalClient.Eval(ctx, script, keys, args...) })
}

// EvalSha runs a loaded script unless the breaker is open.
func (b *Breaker) EvalSha(ctx context.Context, sha1 string, keys []string, args ...any) *redis.Cmd {
	return b.call(ctx, func() *redis.Cmd { return b.UniversalClient.EvalSha(ctx, sha1, keys, args...) })
}

// EvalRO runs a read-only script unless the breaker is open.
func (b *Breaker) EvalRO(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	return b.call(ctx, func() *redis.Cmd { return b.UniversalClient.EvalRO(ctx, script, keys, args...) })
}

// EvalShaRO runs a loaded read-only script unless the breaker is open.
func (b *Breaker) EvalShaRO(ctx context.Context, sha1 string, keys []string, args ...any) *redis.Cmd {
	return b.call(ctx, func() *redis.Cmd { return b.UniversalClient.EvalShaRO(ctx, sha1, keys, args...) })
}

// call runs send unless the breaker is open, and tells the breaker how it went. A script Redis
// does not know (NOSCRIPT, which redis.Script.Run answers by sending it whole) is an answer; a
// call whose caller left (its context canceled, not timed out) says nothing of Redis.
func (b *Breaker) call(ctx context.Context, send func() *redis.Cmd) *redis.Cmd {
	if !b.state.allow() {
		b.shortCircuited.Add(1)
		cmd := redis.NewCmd(ctx)
		cmd.SetErr(ErrOpen)
		return cmd
	}
	cmd := send()
	switch err := cmd.Err(); {
	case err == nil, errors.Is(err, redis.Nil), redis.HasErrorPrefix(err, "NOSCRIPT"):
		b.state.success()
	case errors.Is(ctx.Err(), context.Canceled):
	default:
		b.state.failure()
	}
	return cmd
}

// Ready probes Redis now, even while the breaker is open, and an answer closes it: a replica
// whose Redis came back is ready at the proxy's next check rather than at the end of a
// cool-down. A failed readiness probe opens nothing (it is no decision). The error wraps
// ratelimit.ErrUnavailable, and names the open breaker.
func (b *Breaker) Ready(ctx context.Context) error {
	err := b.probe(ctx, b.UniversalClient)
	switch {
	case err == nil:
		b.state.success()
		return nil
	case !b.state.closed.Load():
		return fmt.Errorf("%w: %w: %w", ratelimit.ErrUnavailable, ErrOpen, err)
	}
	return fmt.Errorf("%w: %w", ratelimit.ErrUnavailable, err)
}

// Open reports whether the breaker is open or half-open: calls fail at once.
func (b *Breaker) Open() bool { return !b.state.closed.Load() }

// ShortCircuited is how many calls the open breaker failed without asking Redis.
func (b *Breaker) ShortCircuited() int64 { return b.shortCircuited.Load() }

// Close stops the probes and waits for one in flight. The client it wraps stays open: it is the
// caller's.
func (b *Breaker) Close() error {
	b.state.stop()
	return nil
}
