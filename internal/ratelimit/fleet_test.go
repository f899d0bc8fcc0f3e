package ratelimit

import (
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/pixlimit/pixlimit/internal/testing/redistest"
)

// world is a fleet of replicas over clients from newClient, with one injected clock; its keys
// have their own prefix, so two worlds share a server without meeting.
func world(t *testing.T, newClient func() redis.Scripter, prefix string, replicas int, clk *clock) []*Limiter {
	t.Helper()
	ls := make([]*Limiter, replicas)
	for i := range ls {
		l, err := New(newClient(), Options{KeySecret: testSecret, Timeout: generous, Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		l.now = clk.Now
		ls[i] = l
	}
	return ls
}

// client makes clients of srv with the generous budget.
func client(srv *redistest.Server) func() redis.Scripter {
	return func() redis.Scripter { return srv.Client(func(o *redis.Options) { ClientOptions(o, generous) }) }
}
