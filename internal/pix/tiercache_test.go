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

	"github.com/pixlimit/pixlimit/internal/testing/pgtest"
)

// flakyTiers is a ledger whose tier table can be changed and made unreadable.
type flakyTiers struct {
	Ledger
	mu    sync.Mutex
	table TierTable
	down  bool
}

func (f *flakyTiers) TierTable(context.Context) (TierTable, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
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
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(2 * time.Second); !ok(); {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 2 s", what)
			}
			time.Sleep(time.Millisecond)
		}
	}
	if p := tt.Table().Figures("acct-ana", Person("PF")).PIXLimit; p != 0 {
		t.Fatalf("at first: PIX limit %d, want 0 (the default)", p)
	}
	f.set(func(f *flakyTiers) {
		f.table = TierTable{Version: 2, Tiers: tiers, Accounts: map[string]TierOf{"acct-ana": {Tier: "restricted"}}}
	})
	waitFor("the change", func() bool { return tt.Table().Figures("acct-ana", Person("PF")).PIXLimit == 5 })
	f.set(func(f *flakyTiers) { f.down = true })
	waitFor("the failure logged", func() bool { return strings.Contains(logs.String(), "keeping the last limits known") })
	time.Sleep(30 * time.Millisecond) // several failed polls
	if p := tt.Table().Figures("acct-ana", Person("PF")).PIXLimit; p != 5 {
		t.Errorf("with the ledger down: PIX limit %d, want 5 (the last table)", p)
	}
	if n := strings.Count(logs.String(), "keeping the last limits known"); n != 1 {
		t.Errorf("the failure logged %d times, want once", n)
	}
	f.set(func(f *flakyTiers) { f.down = false })
	waitFor("the recovery logged", func() bool { return strings.Contains(logs.String(), "tier table read again") })
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
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); !ok(); {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 5 s", what)
			}
			time.Sleep(time.Millisecond)
		}
	}
	limitOf := func(account string) int { return tt.Table().Figures(account, Person("PF")).PIXLimit }
	before, err := l.TierVersion(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.SetTier(ctx, "acct-ana", TierOf{Tier: "restricted"}); err != nil {
		t.Fatal(err)
	}
	waitFor("Ana's change", func() bool { return limitOf("acct-ana") == 5 })
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
	waitFor("Bruno's change, made after the failover", func() bool { return limitOf("acct-bruno") == 5 && limitOf("acct-ana") == 0 })
}
