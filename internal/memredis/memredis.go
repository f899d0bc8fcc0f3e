// Package memredis runs a Redis inside the process: miniredis on a loopback port, with keys that
// expire on the clock. It is the zero-setup default of one API replica (REDIS_URL empty) and the
// demo's Redis; a fleet needs a real one.
package memredis

import (
	"fmt"

	"github.com/alicebob/miniredis/v2"
)

// Server is an in-process Redis. Close stops it; Restart brings it back on the same address,
// data intact.
type Server struct {
	*miniredis.Miniredis
}

// Start starts a Server whose keys expire when the clock says so.
//
// miniredis only expires keys when told that time has passed. Telling it from a ticker, by whole
// ticks, expires a key set just before a tick up to a tick early: a sliding log could then forget
// admissions still inside its window and admit before the Retry-After it announced. ClockTTL
// instead advances every TTL by the clock time elapsed, exactly, on each command, so a key
// expires at the first command after its deadline, never before; the limiter's scripts decide by
// time, so expiring late changes no decision. The price is a walk over every key per command:
// fine for a demo, not for a botnet of 100k keys.
func Start() (*Server, error) {
	mr := miniredis.NewMiniRedis()
	mr.ClockTTL(true)
	if err := mr.Start(); err != nil {
		return nil, fmt.Errorf("embedded redis: %w", err)
	}
	return &Server{Miniredis: mr}, nil
}
