package pixlimit_test

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/pixlimit/pixlimit"
	"github.com/pixlimit/pixlimit/internal/config"
	"github.com/pixlimit/pixlimit/internal/pix"
	"github.com/pixlimit/pixlimit/internal/ratelimit"
	"github.com/pixlimit/pixlimit/internal/redistest"
)

// fleet starts n replicas as separate HTTP servers over one Redis (each with its own client, as
// separate processes would have), one token secret and one ledger.
func fleet(t *testing.T, n int, env map[string]string) []*api {
	t.Helper()
	srv := redistest.Start(t)
	cfg, err := config.Load(func(k string) string {
		if k == "REDIS_TIMEOUT" && env[k] == "" {
			return "1s" // see launch
		}
		return env[k]
	})
	if err != nil {
		t.Fatal(err)
	}
	ledger, err := pix.NewMemoryLedger(pix.DemoAccounts())
	if err != nil {
		t.Fatal(err)
	}
	secret := []byte(testSecret)
	replicas := make([]*api, n)
	for i := range replicas {
		rdb := srv.Client(func(o *redis.Options) { ratelimit.ClientOptions(o, cfg.RedisTimeout) })
		deps, err := pixlimit.NewDeps(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), rdb, secret, ledger)
		if err != nil {
			t.Fatal(err)
		}
		h, err := pixlimit.NewServer(deps)
		if err != nil {
			t.Fatal(err)
		}
		hs := httptest.NewServer(h)
		t.Cleanup(hs.Close)
		replicas[i] = &api{t: t, base: hs.URL, logs: &syncBuffer{}}
	}
	return replicas
}

// burst sends n requests at once, request i to replica i mod len(replicas), and counts statuses.
func burst(replicas []*api, n int, send func(a *api, i int) response) map[int]int {
	var mu sync.Mutex
	var wg sync.WaitGroup
	counts := map[int]int{}
	for i := range n {
		wg.Go(func() {
			r := send(replicas[i%len(replicas)], i)
			mu.Lock()
			counts[r.status]++
			mu.Unlock()
		})
	}
	wg.Wait()
	return counts
}

func TestFleetLimitsHoldExactly(t *testing.T) {
	t.Parallel()
	replicas := fleet(t, 3, map[string]string{"TRUSTED_PROXIES": "127.0.0.1/32"})

	// A token from one replica works on every other.
	ana := replicas[0].token(demo[0].document, demo[0].password)
	before := replicas[1].balance(ana)

	pix := burst(replicas, 30, func(a *api, i int) response { return a.pix(ana, "bruno@example.com", 100) })
	if pix[201] != 10 || pix[429] != 20 || len(pix) != 2 {
		t.Errorf("30 concurrent PIX over 3 replicas: %v, want exactly 10 × 201 and 20 × 429", pix)
	}
	if got, want := replicas[2].balance(ana), before-10*100; got != want {
		t.Errorf("balance %d, want %d: exactly the admitted transfers moved money", got, want)
	}

	bruno := replicas[2].token(demo[1].document, demo[1].password)
	st := burst(replicas, 45, func(a *api, i int) response { return a.statement(bruno) })
	if st[200] != 30 || st[429] != 15 {
		t.Errorf("45 concurrent statements over 3 replicas: %v, want exactly 30 × 200 and 15 × 429", st)
	}

	// The login's document key across the fleet: a botnet, one IP per guess, at Carla's CPF.
	byDoc := burst(replicas, 20, func(a *api, i int) response {
		return a.login(demo[2].document, "guess", "X-Forwarded-For", fmt.Sprintf("203.0.113.%d", i+1))
	})
	if byDoc[401] != 5 || byDoc[429] != 15 {
		t.Errorf("20 guesses from 20 IPs over 3 replicas: %v, want exactly 5 × 401 and 15 × 429", byDoc)
	}
	// And its IP key: one IP, many documents.
	byIP := burst(replicas, 25, func(a *api, i int) response {
		return a.login(cpf(500+i), "guess", "X-Forwarded-For", "198.51.100.200")
	})
	if byIP[401] != 10 || byIP[429] != 15 {
		t.Errorf("25 documents from one IP over 3 replicas: %v, want exactly 10 × 401 and 15 × 429", byIP)
	}
}

func TestConfigErrorsStopTheProgram(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		env   map[string]string
		names []string
	}{
		{map[string]string{"PIX_LIMIT": "0"}, []string{"PIX_LIMIT"}},
		{map[string]string{"LOGIN_WINDOW": "90ms"}, []string{"LOGIN_WINDOW"}},
		{map[string]string{"TRUSTED_PROXIES": "10.0.0.0/33"}, []string{"TRUSTED_PROXIES"}},
		{map[string]string{"AUTH_SECRET": "too-short", "STATEMENT_FAIL_MODE": "ajar"}, []string{"AUTH_SECRET", "STATEMENT_FAIL_MODE"}},
		// A fleet with a random secret per replica would multiply every limit by its size.
		{map[string]string{"REDIS_URL": "redis://127.0.0.1:1"}, []string{"AUTH_SECRET"}},
		{map[string]string{"REDIS_CLUSTER_ADDRS": "127.0.0.1:1"}, []string{"AUTH_SECRET"}},
		{map[string]string{"AUTH_SECRET": "dev-only-secret-change-me-0123456789abcdef"}, []string{"AUTH_SECRET"}},
		{map[string]string{"REDIS_SENTINEL_ADDRS": "s:sentinel", "REDIS_SENTINEL_MASTER": "m", "AUTH_SECRET": testSecret}, []string{"REDIS_SENTINEL_ADDRS"}},
	} {
		addr := freeAddr(t)
		env := map[string]string{"HTTP_ADDR": addr}
		for k, v := range tt.env {
			env[k] = v
		}
		err := pixlimit.Run(t.Context(), []string{"api"}, func(k string) string { return env[k] }, io.Discard, io.Discard)
		if err == nil {
			t.Fatalf("%v: Run returned nil", tt.env)
		}
		for _, name := range tt.names {
			if !strings.Contains(err.Error(), name+":") {
				t.Errorf("%v: error does not name %s:\n%v", tt.env, name, err)
			}
		}
		if _, err := http.Get("http://" + addr + "/healthz"); err == nil {
			t.Errorf("%v: something listens on %s after a configuration error", tt.env, addr)
		}
	}
}
