package pix

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pixlimit/pixlimit/internal/testing/pgtest"
)

// flakyTiers is a ledger whose tier table can be changed and made unreadable.
type flakyTiers struct {
	Ledger
	mu    sync.Mutex
	table TierTable
	down  bool
	reads int // how many times the table or its version was asked
}

func (f *flakyTiers) TierTable(context.Context) (TierTable, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads++
	if f.down {
		return TierTable{}, ErrUnavailable
	}
	return f.table, nil
}

func (f *flakyTiers) TierVersion(ctx context.Context) (int64, error) {
	t, err := f.TierTable(ctx)
	return t.Version, err
}

func (f *flakyTiers) set(fn func(f *flakyTiers)) { f.mu.Lock(); fn(f); f.mu.Unlock() }

// waitFor waits until ok, for at most 5 s: what a poller does, it does on its own ticker.
func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !ok(); {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 5 s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// syncBuffer is a log a poller writes while a test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// TestTiersKeepTheLastTableWhenTheLedgerFails: a change is picked up within a few polls; while
// the table cannot be read the replica keeps the last limits it knew (never none), logs it once,
// and logs again when it reads it.
func TestTiersKeepTheLastTableWhenTheLedgerFails(t *testing.T) {
	t.Parallel()
	tiers := map[string]Tier{"pf": {Name: "pf"}, "restricted": {Name: "restricted", PIXLimit: 5}}
	f := &flakyTiers{table: TierTable{Version: 1, Tiers: tiers, Accounts: map[string]TierOf{}}}
	logs := &syncBuffer{}
	tt := NewTiers(context.Background(), f, slog.New(slog.NewTextHandler(logs, nil)), 5*time.Millisecond)
	defer tt.Close()
	if p := tt.Table().Figures("acct-ana", Person("PF")).PIXLimit; p != 0 {
		t.Fatalf("at first: PIX limit %d, want 0 (the default)", p)
	}
	f.set(func(f *flakyTiers) {
		f.table = TierTable{Version: 2, Tiers: tiers, Accounts: map[string]TierOf{"acct-ana": {Tier: "restricted"}}}
	})
	waitFor(t, "the change", func() bool { return tt.Table().Figures("acct-ana", Person("PF")).PIXLimit == 5 })
	f.set(func(f *flakyTiers) { f.down = true })
	waitFor(t, "the failure logged", func() bool { return strings.Contains(logs.String(), "keeping the last limits known") })
	reads := func() (n int) { f.set(func(f *flakyTiers) { n = f.reads }); return n }
	failed := reads()
	waitFor(t, "three more failed polls", func() bool { return reads() >= failed+3 })
	if p := tt.Table().Figures("acct-ana", Person("PF")).PIXLimit; p != 5 {
		t.Errorf("with the ledger down: PIX limit %d, want 5 (the last table)", p)
	}
	if n := strings.Count(logs.String(), "keeping the last limits known"); n != 1 {
		t.Errorf("the failure logged %d times, want once", n)
	}
	f.set(func(f *flakyTiers) { f.down = false })
	waitFor(t, "the recovery logged", func() bool { return strings.Contains(logs.String(), "tier table read again") })
	if err := tt.Refresh(context.Background()); err != nil || errors.Is(err, ErrUnavailable) {
		t.Fatal(err)
	}
}

// TestATierChangeAfterAFailoverIsSeen: a replica has read a change that the database then
// loses (a failover to a standby that had not received it, or a restore): the database is back at
// the version before it. The next change must not take the version the replica already holds,
// or the replica would keep the lost table and never load the new one (a revocation unseen).
func TestATierChangeAfterAFailoverIsSeen(t *testing.T) {
	t.Parallel()
	l, err := OpenPostgres(context.Background(), pgtest.URL(t), 10*time.Second, demo())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	ctx := t.Context()
	tt := NewTiers(ctx, l, slog.New(slog.DiscardHandler), 5*time.Millisecond)
	defer tt.Close()
	limitOf := func(account string) int { return tt.Table().Figures(account, Person("PF")).PIXLimit }
	before, err := l.TierVersion(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.SetTier(ctx, "acct-ana", TierOf{Tier: "restricted"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "Ana's change", func() bool { return limitOf("acct-ana") == 5 })
	// The failover: the new primary never received Ana's change.
	if _, err := l.pool.Exec(ctx, "DELETE FROM account_tiers WHERE account_id = 'acct-ana'"); err != nil {
		t.Fatal(err)
	}
	if _, err := l.pool.Exec(ctx, "UPDATE tier_version SET version = $1", before); err != nil {
		t.Fatal(err)
	}
	if err := l.SetTier(ctx, "acct-bruno", TierOf{Tier: "restricted"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "Bruno's change, made after the failover", func() bool { return limitOf("acct-bruno") == 5 && limitOf("acct-ana") == 0 })
}

// TestOnlyRemovalsThatRefuseSomethingAreKept: a device's removal refuses the tokens issued
// before it, which live at most the token lifetime (WithTokenLifetime); past that and a margin for
// the replicas' clocks it refuses nothing, so the tier table no longer carries it, and the next
// removal deletes its row. Before, every removal ever made was read by every replica on every
// change: at half a million the reload outlasted its deadline, and the replicas kept a stale
// table (revocations unseen).
func TestOnlyRemovalsThatRefuseSomethingAreKept(t *testing.T) {
	t.Parallel()
	clock := &testClock{now: time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)}
	l, err := OpenPostgres(context.Background(), pgtest.URL(t), 10*time.Second, demo(), WithClock(clock.Now), WithTokenLifetime(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	ctx := t.Context()
	remove := func(device string) {
		t.Helper()
		if _, err := l.RegisterDevice(ctx, "acct-ana", device, time.Hour); err != nil {
			t.Fatal(err)
		}
		if err := l.RemoveDevice(ctx, "acct-ana", device, device); err != nil {
			t.Fatal(err)
		}
	}
	removedAt := clock.Now()
	remove("old-phone")
	clock.Advance(59 * time.Minute)
	if table, err := l.TierTable(ctx); err != nil || !table.RemovedSince("acct-ana", "old-phone").Equal(removedAt) {
		t.Errorf("59 min after the removal: %v (%v), want it kept: a token issued before it may live", table.RemovedSince("acct-ana", "old-phone"), err)
	}
	clock.Advance(time.Minute + removalMargin - time.Second)
	if table, err := l.TierTable(ctx); err != nil || !table.RemovedSince("acct-ana", "old-phone").Equal(removedAt) {
		t.Errorf("within the margin for the replicas' clocks: %v (%v), want it kept", table.RemovedSince("acct-ana", "old-phone"), err)
	}
	clock.Advance(2 * time.Second)
	if table, err := l.TierTable(ctx); err != nil || !table.RemovedSince("acct-ana", "old-phone").IsZero() {
		t.Errorf("past the lifetime and the margin: %v (%v), want it gone: no token issued before it lives", table.RemovedSince("acct-ana", "old-phone"), err)
	}
	remove("new-phone")
	var rows []string
	r, err := l.pool.Query(ctx, "SELECT device_id FROM removed_devices ORDER BY device_id")
	if err == nil {
		rows, err = pgx.CollectRows(r, pgx.RowTo[string])
	}
	if err != nil || len(rows) != 1 || rows[0] != "new-phone" {
		t.Errorf("removed_devices after the next removal: %v (%v), want new-phone alone", rows, err)
	}
}

// slowTiers is a ledger whose tier table takes delay to read, within its caller's deadline.
type slowTiers struct {
	*flakyTiers
	delay time.Duration
}

func (s slowTiers) TierTable(ctx context.Context) (TierTable, error) {
	select {
	case <-time.After(s.delay):
		return s.flakyTiers.TierTable(ctx)
	case <-ctx.Done():
		return TierTable{}, ctx.Err()
	}
}

// TestATableSlowerThanAnIntervalIsStillRead: the poller asks the version within an interval,
// but reloads the table within the ledger's own deadline: a table that takes longer to read than
// an interval is read late, not never (with the interval as its deadline, every reload failed).
func TestATableSlowerThanAnIntervalIsStillRead(t *testing.T) {
	t.Parallel()
	tiers := map[string]Tier{"pf": {Name: "pf"}, "restricted": {Name: "restricted", PIXLimit: 5}}
	f := &flakyTiers{table: TierTable{Version: 1, Tiers: tiers, Accounts: map[string]TierOf{}}}
	tt := NewTiers(context.Background(), slowTiers{f, 20 * time.Millisecond}, slog.New(slog.DiscardHandler), 5*time.Millisecond)
	defer tt.Close()
	f.set(func(f *flakyTiers) {
		f.table = TierTable{Version: 2, Tiers: tiers, Accounts: map[string]TierOf{"acct-ana": {Tier: "restricted"}}}
	})
	waitFor(t, "a change whose table takes 20 ms to read, polled every 5 ms", func() bool {
		return tt.Table().Figures("acct-ana", Person("PF")).PIXLimit == 5
	})
}

// TestTiersSayWhenTheyAreStale: the table holds the revocations, so a replica that cannot read
// it must say so (Fresh, which /readyz asks): at start until the first read, and once the
// ledger has failed for longer than the bound; fresh again when it answers.
func TestTiersSayWhenTheyAreStale(t *testing.T) {
	t.Parallel()
	f := &flakyTiers{table: TierTable{Version: 1, Accounts: map[string]TierOf{}}, down: true}
	tt := NewTiers(context.Background(), f, slog.New(slog.DiscardHandler), 5*time.Millisecond)
	defer tt.Close()
	if err := tt.Fresh(time.Hour); !errors.Is(err, ErrStale) {
		t.Errorf("never read: %v, want ErrStale", err)
	}
	f.set(func(f *flakyTiers) { f.down = false })
	waitFor(t, "fresh once read", func() bool { return tt.Fresh(time.Hour) == nil })
	waitFor(t, "fresh while polls find it unchanged", func() bool { return tt.Fresh(20*time.Millisecond) == nil })
	f.set(func(f *flakyTiers) { f.down = true })
	waitFor(t, "stale once the ledger fails", func() bool { return errors.Is(tt.Fresh(20*time.Millisecond), ErrStale) })
	f.set(func(f *flakyTiers) { f.down = false })
	waitFor(t, "fresh again", func() bool { return tt.Fresh(20*time.Millisecond) == nil })
}
