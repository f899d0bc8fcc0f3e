// Command api serves the pixlimit API, configured by its environment (see docs/api.md). main is
// a shim over run, which tests drive as a whole program on a free port.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/redis/go-redis/v9"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// go-redis has one logger per process, so the process's owner sets it, once: its messages
	// (each failed dial, during an outage) go to slog's default logger at debug level, since the
	// replica reports outages itself (package outages), throttled, at error level.
	redis.SetLogger(goRedisLogger{})
	if err := run(ctx, os.Args, os.Environ(), os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "api:", err)
		os.Exit(1)
	}
}

type goRedisLogger struct{}

func (goRedisLogger) Printf(ctx context.Context, format string, v ...any) {
	slog.DebugContext(ctx, fmt.Sprintf(format, v...), "component", "go-redis")
}
