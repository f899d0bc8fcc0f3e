package main

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/pixlimit/pixlimit/internal/testing/redistest"
)

// TestAFloodOfIdentitiesNeverMakesRedisForgetAFullKey: compose's Redis, its maxmemory policy as
// docker-compose.yml sets it, scaled down to 3 MB. Carla's document key is full; then 12,000
// logins from 12,000 IPv6 /64s, each a key of its own, fill the memory. Under an evicting policy
// (volatile-ttl, which compose had) Redis drops the keys nearest their expiry, Carla's first,
// and her next guesses are checked; under noeviction it refuses writes instead, so decisions
// fail and the login fails closed, loudly (429 rate_limiter_unavailable, /readyz 503), and her
// key is never forgotten.
func TestAFloodOfIdentitiesNeverMakesRedisForgetAFullKey(t *testing.T) {
	t.Parallel()
	command := readCompose(t, repo("docker-compose.yml")).Services["redis"].Command
	i := slices.Index(command, "--maxmemory-policy")
	if i < 0 || i+1 >= len(command) {
		t.Fatalf("compose's redis command %q sets no --maxmemory-policy", command)
	}
	policy := command[i+1]
	srv := redistest.StartWith(t, "--maxmemory", "3mb", "--maxmemory-policy", policy) // the scripts take about 0.3 MB of it
	// No deny cache: it would answer Carla's refusals for its hold (5 s) without asking Redis,
	// and hide what Redis kept; an attack lasts longer than that.
	a := startAPI(t, srv, map[string]string{"TRUSTED_PROXIES": "127.0.0.1/32", "LOG_LEVEL": "warn", "RATELIMIT_DENY_CACHE_SIZE": "0"})
	carla := demo[2]
	for i := range 5 {
		if r := a.Login(carla.Document, "guess", "X-Forwarded-For", fmt.Sprintf("198.51.100.%d", i+1)); r.Status != http.StatusUnauthorized {
			t.Fatalf("guess %d: %v, want 401", i+1, r)
		}
	}
	if r := a.Login(carla.Document, carla.Password, "X-Forwarded-For", "198.51.100.9"); r.Status != http.StatusTooManyRequests {
		t.Fatalf("her document key full: %v, want 429", r)
	}

	var mu sync.Mutex
	codes := map[string]int{}
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			for n := w; n < 12_000; n += 16 {
				ip := fmt.Sprintf("2001:db8:%x::1", n) // a /48 each (one site's /64s count against its /48: login-net)
				r := a.Do(http.MethodPost, "/v1/login", `{"document":"x","password":"x"}`, "X-Forwarded-For", ip)
				code, _ := r.JSON(t)["error"].(string)
				mu.Lock()
				codes[code]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	// What a one-request identity costs Redis, for sizing maxmemory (docs/how-it-works.md, "A full Redis fails loudly").
	info, _ := srv.Client(nil).Info(t.Context(), "stats", "memory").Result()
	stat := func(name string) float64 {
		for _, line := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, name+":"); ok {
				f, _ := strconv.ParseFloat(v, 64)
				return f
			}
		}
		return 0
	}
	keys, _ := srv.Client(nil).DBSize(t.Context()).Result()
	t.Logf("maxmemory-policy %s: the flood's answers %v; Redis evicted %.0f keys, holds %d, about %.0f bytes each",
		policy, codes, stat("evicted_keys"), keys, stat("used_memory_dataset")/float64(max(keys, 1)))

	for i := range 5 { // the botnet goes on guessing
		r := a.Login(carla.Document, "guess", "X-Forwarded-For", fmt.Sprintf("203.0.113.%d", i+1))
		if r.Status != http.StatusTooManyRequests {
			t.Errorf("maxmemory-policy %s: guess %d after the flood: %v, want 429: her full key was forgotten", policy, i+1, r)
		}
	}
	if codes["rate_limiter_unavailable"] == 0 {
		t.Errorf("maxmemory-policy %s: the flood filled Redis and no login said so (%v): want it to fail closed, loudly", policy, codes)
	}
	// Readiness follows what Redis can do now: once the flood's connections are idle, their
	// buffers freed, Redis may hold a few kB under its maxmemory and take a write again, and the
	// probe rightly passes. Held full (a maxmemory below what it holds), it refuses every write,
	// so neither a decision nor the probe can pass.
	if err := srv.Client(nil).ConfigSet(t.Context(), "maxmemory", "1mb").Err(); err != nil {
		t.Fatal(err)
	}
	login := a.Do(http.MethodPost, "/v1/login", `{"document":"x","password":"x"}`, "X-Forwarded-For", "2001:db8:ffff::1")
	if code, _ := login.JSON(t)["error"].(string); code != "rate_limiter_unavailable" {
		t.Errorf("maxmemory-policy %s: a new site's login with Redis full: %v, want 429 rate_limiter_unavailable", policy, login)
	}
	if r := a.Do(http.MethodGet, "/readyz", nil); r.Status != http.StatusServiceUnavailable {
		t.Errorf("maxmemory-policy %s: /readyz with Redis full: %v, want 503", policy, r)
	}
}
