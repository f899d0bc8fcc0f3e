package ratelimit

import (
	"testing"

	"github.com/redis/go-redis/v9"
)

// TestClusterModeSurvivesAWrapper: a client that wraps a cluster client is not recognized by its
// type, so Options.Cluster declares it; nothing is decided in one script across slots then (its
// Runner splits them: a cluster Limiter without one is refused).
func TestClusterModeSurvivesAWrapper(t *testing.T) {
	t.Parallel()
	type wrapped struct{ redis.Scripter }
	plain := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer plain.Close()
	for _, tt := range []struct {
		opts Options
		want bool
	}{{Options{KeySecret: testSecret}, false}, {Options{KeySecret: testSecret, Cluster: true, Runner: Scripts(plain)}, true}} {
		l, err := New(wrapped{plain}, tt.opts)
		if err != nil {
			t.Fatal(err)
		}
		if l.cluster != tt.want {
			t.Errorf("Options.Cluster=%v: cluster mode %v, want %v", tt.opts.Cluster, l.cluster, tt.want)
		}
	}

	if _, err := New(wrapped{plain}, Options{KeySecret: testSecret, Cluster: true}); err == nil {
		t.Error("a cluster Limiter without a Runner: want an error (one script cannot decide keys of several slots)")
	}
}
