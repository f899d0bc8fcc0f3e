package httpapi_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pixlimit/pixlimit/internal/httpapi"
	"github.com/pixlimit/pixlimit/internal/testing/redistest"
)

// TestReadyzProbesRunTogether: two probes that each answer only once the other has started can
// both pass only if /readyz runs them at the same time; one after the other, the first waits
// out its timeout. A probe that fails makes the replica not ready, and says which; its change
// of state is logged once each way, with the cause, however often /readyz is asked.
func TestReadyzProbesRunTogether(t *testing.T) {
	t.Parallel()
	started := map[string]chan struct{}{"redis": make(chan struct{}), "database": make(chan struct{})}
	other := map[string]string{"redis": "database", "database": "redis"}
	failing := ""
	probe := func(name string) httpapi.Probe {
		return httpapi.Probe{Name: name, Timeout: 2 * time.Second, Ping: func(ctx context.Context) error {
			close(started[name])
			select {
			case <-started[other[name]]:
			case <-ctx.Done():
				return ctx.Err()
			}
			if name == failing {
				return context.DeadlineExceeded
			}
			return nil
		}}
	}
	s := newServer(t, redistest.Start(t), lax(), probe("redis"), probe("database"))

	for _, tc := range []struct {
		failing    string
		wantStatus int
		want       map[string]string
	}{
		{"", http.StatusOK, map[string]string{"status": "ready", "redis": "up", "database": "up"}},
		{"database", http.StatusServiceUnavailable, map[string]string{"status": "degraded", "redis": "up", "database": "down"}},
		{"database", http.StatusServiceUnavailable, map[string]string{"status": "degraded", "redis": "up", "database": "down"}},
		{"", http.StatusOK, map[string]string{"status": "ready", "redis": "up", "database": "up"}},
	} {
		failing = tc.failing
		started["redis"], started["database"] = make(chan struct{}), make(chan struct{})
		rec := httptest.NewRecorder()
		s.h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		var got map[string]string
		if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
			t.Fatalf("body %q: %v", rec.Body, err)
		}
		if rec.Code != tc.wantStatus || len(got) != len(tc.want) || got["status"] != tc.want["status"] ||
			got["redis"] != tc.want["redis"] || got["database"] != tc.want["database"] {
			t.Errorf("failing %q: %d %v, want %d %v", tc.failing, rec.Code, got, tc.wantStatus, tc.want)
		}
	}
	logs := s.logs.String()
	if got := strings.Count(logs, "readiness: a dependency is down"); got != 1 || !strings.Contains(logs, "probe=database cause=\"context deadline exceeded\"") {
		t.Errorf("the database down twice logged %d times (want once, with its cause):\n%s", got, logs)
	}
	if got := strings.Count(logs, "readiness: a dependency is up again"); got != 1 {
		t.Errorf("the database back logged %d times, want once:\n%s", got, logs)
	}
}

// TestAFloodOfReadyzHoldsOneConnection: /readyz is public, and each round of probes holds a
// Redis connection and a database one. Fifty at once run one round at a time (never two probes
// of a kind together), a few rounds for all of them, and each answers what its round found.
func TestAFloodOfReadyzHoldsOneConnection(t *testing.T) {
	t.Parallel()
	var running, most, rounds atomic.Int32
	probe := httpapi.Probe{Name: "redis", Timeout: 2 * time.Second, Ping: func(ctx context.Context) error {
		rounds.Add(1)
		n := running.Add(1)
		defer running.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		select { // a slow dependency: the flood piles up behind it
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
		}
		return nil
	}}
	s := newServer(t, redistest.Start(t), lax(), probe)
	statuses := make(chan int, 50)
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			rec := httptest.NewRecorder()
			s.h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
			statuses <- rec.Code
		})
	}
	wg.Wait()
	close(statuses)
	for code := range statuses {
		if code != http.StatusOK {
			t.Errorf("/readyz %d, want 200", code)
		}
	}
	if got := most.Load(); got != 1 {
		t.Errorf("%d probes at once, want 1: one round at a time", got)
	}
	if got := rounds.Load(); got > 10 {
		t.Errorf("%d rounds for 50 requests at once, want a few: the requests that come during a round share the next", got)
	}
}

// TestReadyzRestsBetweenRounds: a round of probes starts 100 ms at least after the last one
// ended (readyGap), so that /readyz asked back to back runs ten rounds a second at most; and
// each request is answered by a round that started after it came: asked one after the other,
// every request makes a round of its own. (A busy machine only lengthens the gaps.)
func TestReadyzRestsBetweenRounds(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var starts, ends []time.Time
	probe := httpapi.Probe{Name: "redis", Timeout: 2 * time.Second, Ping: func(ctx context.Context) error {
		mu.Lock()
		defer mu.Unlock()
		starts = append(starts, time.Now())
		ends = append(ends, time.Now())
		return nil
	}}
	s := newServer(t, redistest.Start(t), lax(), probe)
	const asked = 5
	for range asked {
		rec := httptest.NewRecorder()
		s.h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		if rec.Code != http.StatusOK {
			t.Fatalf("/readyz %d, want 200", rec.Code)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(starts) != asked {
		t.Fatalf("%d rounds for %d requests one after the other, want one each", len(starts), asked)
	}
	for i := 1; i < asked; i++ {
		if gap := starts[i].Sub(ends[i-1]); gap < 100*time.Millisecond {
			t.Errorf("round %d started %v after round %d ended, want 100ms at least", i+1, gap, i)
		}
	}
}
