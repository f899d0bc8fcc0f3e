package memredis

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestEmbeddedRedisExpiresKeysOnTime: the embedded default expires a key at its deadline, never
// earlier, whenever within a second it was set (the clock is injected: no sleeping).
func TestEmbeddedRedisExpiresKeysOnTime(t *testing.T) {
	t.Parallel()
	mr, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	ctx := context.Background()
	start := time.Date(2026, 11, 30, 12, 0, 0, 900_000_000, time.UTC) // 0.9 s into a second
	mr.SetTime(start)
	if err := rdb.Set(ctx, "k", "v", 1500*time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct {
		after time.Duration
		want  int64
	}{{100 * time.Millisecond, 1}, {1499 * time.Millisecond, 1}, {1500 * time.Millisecond, 0}} {
		mr.SetTime(start.Add(step.after))
		if got := rdb.Exists(ctx, "k").Val(); got != step.want {
			t.Errorf("%v after a 1.5 s TTL: exists = %d, want %d", step.after, got, step.want)
		}
	}
}
