package ratelimit

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pixlimit/pixlimit/internal/testing/apitest"
	"github.com/pixlimit/pixlimit/internal/testing/redistest"
)

// freezer is a Redis client that freezes the server (SIGSTOP) right after the first reply on a
// trigger key, once armed, and thaws it thaw later: every call after that reply, the withdrawal
// of the admission it answered included, meets a frozen Redis, whatever the machine's speed. It
// stands for an overloaded Redis that stops answering in the middle of a burst.
type freezer struct {
	redis.Scripter
	srv     *redistest.Server
	trigger map[string]bool
	thaw    time.Duration
	armed   atomic.Bool
	once    sync.Once
	thawed  chan struct{}
}

func (f *freezer) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	cmd := f.Scripter.EvalSha(ctx, sha, keys, args...)
	if f.armed.Load() && len(keys) == 1 && f.trigger[keys[0]] && cmd.Err() == nil {
		f.once.Do(func() {
			f.srv.Pause()
			time.AfterFunc(f.thaw, func() { f.srv.Resume(); close(f.thawed) })
		})
	}
	return cmd
}

// frozenSplit builds a Limiter on the cluster path (forced, on one node) over a freezer, fills
// the key full, and sends n two-key decisions (open_i, full) at once, the freezer armed on the
// open keys: each decision is refused by full or fails in the freeze, so the first open key's
// admission, and every other one answered before the freeze, must be withdrawn while Redis is
// frozen. It returns the Limiter, the open keys' policy and the freezer.
func frozenSplit(t *testing.T, a Algorithm, n int, thaw time.Duration, logs *apitest.Logs, withdrawn func(time.Duration)) (*Limiter, Policy, *freezer) {
	t.Helper()
	srv := redistest.Start(t)
	f := &freezer{Scripter: srv.Client(func(o *redis.Options) { ClientOptions(o, budget) }), srv: srv, thaw: thaw, thawed: make(chan struct{})}
	t.Cleanup(func() {
		if f.armed.Load() {
			<-f.thawed // a frozen server cannot be stopped
		}
	})
	l, err := New(f, Options{KeySecret: testSecret, Timeout: budget, Cluster: true,
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	l.withdrawn = withdrawn
	withClock(l) // no refill, no window passing: what a key holds is what was not taken back
	open := Policy{Name: "open", Limit: 5, Window: time.Hour, Algorithm: a}
	full := Check{Policy{Name: "full", Limit: 1, Window: time.Hour, Algorithm: a}, "x"}
	warm(t, l, full) // the one admission that fills it
	f.trigger = map[string]bool{}
	for i := range n {
		f.trigger[l.keys.key(open, fmt.Sprint("open", i))] = true
	}
	f.armed.Store(true)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			if d, err := l.AllowAll(context.Background(), Check{open, fmt.Sprint("open", i)}, full); err == nil && d.Allowed {
				t.Errorf("decision %d admitted with a full key", i)
			}
		})
	}
	wg.Wait()
	return l, open, f
}

// held is how much of their capacity the n open keys hold, as Redis says (asked through l, which
// takes nothing; after Close too, since asking starts no withdrawal). Each key gets three tries
// within the tight budget: on a busy machine a just-thawed server's first answers can miss it
// (an "i/o timeout" failed this beside four CPU burners).
func held(t *testing.T, l *Limiter, open Policy, n int) (total int) {
	t.Helper()
	for i := range n {
		var d Decision
		var err error
		for range 3 {
			if d, err = l.AskAll(context.Background(), Check{open, fmt.Sprint("open", i)}); err == nil {
				break
			}
		}
		if err != nil {
			t.Fatal(err)
		}
		total += d.Worst.Capacity - d.Worst.Remaining
	}
	return total
}

// TestWithdrawalsOutlastAFrozenRedis: on a cluster, 40 logins whose document key is full are
// refused and their IP keys' admissions must be withdrawn; Redis freezes the moment the first
// refusal comes back, for 3 s, longer than the withdrawals used to try (one attempt, or four over
// 2.6 s for a late decision). Once it thaws every admission is taken back: the IP keys hold
// nothing, none was lost, and some were withdrawn only after the thaw.
func TestWithdrawalsOutlastAFrozenRedis(t *testing.T) {
	t.Parallel()
	const n, thaw = 40, 3 * time.Second
	var logs apitest.Logs
	var heldMu sync.Mutex
	var longest time.Duration
	l, open, f := frozenSplit(t, SlidingLog, n, thaw, &logs,
		func(d time.Duration) { heldMu.Lock(); longest = max(longest, d); heldMu.Unlock() })
	<-f.thawed
	settledQueue(t, l)
	if got := held(t, l, open, n); got != 0 {
		t.Errorf("the open keys hold %d admissions after the thaw, want 0: withdrawals were lost\n%s", got, logs.String())
	}
	if lost := l.Stats().WithdrawalsLost; lost != 0 {
		t.Errorf("%d withdrawals counted lost, want 0", lost)
	}
	heldMu.Lock()
	defer heldMu.Unlock()
	if longest < thaw/2 {
		t.Errorf("the longest-held admission was withdrawn %v after its decision: the freeze did not catch the withdrawals", longest)
	}
	t.Logf("the longest-held admission was withdrawn %v after its decision", longest.Round(time.Millisecond))
}

// TestLostWithdrawalsAreCountedAndLogged: a fixed window's withdrawal gives one back, so an
// attempt that timed out (and may have run) is not tried again: it is counted lost and logged.
// The Limiter closes while Redis is frozen, and Close ends within its drain.
func TestLostWithdrawalsAreCountedAndLogged(t *testing.T) {
	t.Parallel()
	const n = 20
	var logs apitest.Logs
	l, open, f := frozenSplit(t, FixedWindow, n, 3*time.Second, &logs, nil)
	start := time.Now()
	_ = l.Close()
	if took := time.Since(start); took > l.closeDrain()+2*time.Second {
		t.Errorf("Close took %v with Redis frozen, want about its drain (%v)", took, l.closeDrain())
	}
	<-f.thawed
	lost := l.Stats().WithdrawalsLost
	if lost == 0 {
		t.Fatalf("no withdrawal counted lost with Redis frozen through Close\n%s", logs.String())
	}
	t.Logf("%d withdrawals lost; the open keys hold %d admissions (late ones too, which a counter cannot withdraw)", lost, held(t, l, open, n))
	if !strings.Contains(logs.String(), "could not withdraw admissions") {
		t.Errorf("the losses were not logged:\n%s", logs.String())
	}
}

// settledQueue checks that l's withdrawal queue holds nothing once every withdrawal settled: its
// memory accounting, with the retries of a freeze, comes back to zero. (A worker counts its
// attempt out of flight just after the attempt settles its withdrawal: that count is not checked.)
func settledQueue(t *testing.T, l *Limiter) {
	t.Helper()
	l.withdrawals.Wait()
	q := l.withdrawQ
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.items) != 0 || q.bytes != 0 {
		t.Errorf("after every withdrawal settled: %d waiting, %d bytes counted; want none", len(q.items), q.bytes)
	}
}

// TestMayHaveRun: only a failure that surely sent nothing, or Redis's own refusal, says the
// script did not run; a timeout, a reset or an EOF after sending may have run it.
func TestMayHaveRun(t *testing.T) {
	for _, tt := range []struct {
		err  error
		want bool
	}{
		{context.DeadlineExceeded, true},
		{io.EOF, true},
		{&net.OpError{Op: "read", Err: syscall.ECONNRESET}, true},
		{&net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}, false},
		{redis.ErrPoolTimeout, false},
		{fmt.Errorf("%w: %w", ErrUnavailable, redis.ErrClosed), false},
	} {
		if got := mayHaveRun(tt.err); got != tt.want {
			t.Errorf("mayHaveRun(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}
