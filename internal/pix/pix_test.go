package pix

import (
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"math/rand/v2"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/crypto/bcrypt"

	"github.com/pixlimit/pixlimit/internal/testing/pgtest"
)

func TestParseCPF(t *testing.T) {
	tests := []struct {
		in, want string
		ok       bool
	}{
		{"529.982.247-25", "52998224725", true},
		{"52998224725", "52998224725", true},
		{"111.444.777-35", "11144477735", true},
		{"529.982.247-26", "", false}, // second check digit
		{"529.982.247-15", "", false}, // first check digit
		{"111.111.111-11", "", false}, // all equal: passes the arithmetic, never issued
		{"00000000000", "", false},
		{"5299822472", "", false},
		{"529982247255", "", false},
		{"529.982.24725", "", false}, // punctuation only where it belongs
		{"529-982-247.25", "", false},
		{"52998224725 ", "", false},
		{"", "", false},
		{"５２９９８２２４７２５", "", false}, // full-width digits are not digits here
	}
	for _, tt := range tests {
		got, err := ParseCPF(tt.in)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("ParseCPF(%q) = %q, %v; want %q, ok=%v", tt.in, got, err, tt.want, tt.ok)
		}
	}
}

func TestCompleteCPF(t *testing.T) {
	for base, want := range map[string]string{"529982247": "52998224725", "111444777": "11144477735", "390533447": "39053344705"} {
		if got, err := CompleteCPF(base); err != nil || got != want {
			t.Errorf("CompleteCPF(%s) = %s, %v; want %s", base, got, err, want)
		}
	}
	for _, bad := range []string{"111111111", "12345678", "12345678a"} {
		if got, err := CompleteCPF(bad); err == nil {
			t.Errorf("CompleteCPF(%s) = %s, want an error", bad, got)
		}
	}
}

func FuzzParseCPF(f *testing.F) {
	for _, s := range []string{"529.982.247-25", "52998224725", "111.111.111-11", "abc", ""} {
		f.Add(s)
	}
	digits := regexp.MustCompile(`^[0-9]{11}$`)
	f.Fuzz(func(t *testing.T, s string) {
		got, err := ParseCPF(s)
		if err != nil {
			return
		}
		if !digits.MatchString(got) {
			t.Fatalf("ParseCPF(%q) = %q: not 11 digits", s, got)
		}
		if again, err := ParseCPF(got); err != nil || again != got {
			t.Fatalf("ParseCPF(%q) = %q, %v: not idempotent", got, again, err)
		}
	})
}

func TestParseKey(t *testing.T) {
	tests := []struct {
		in, want string
		typ      KeyType
	}{
		{"ana@example.com", "ana@example.com", KeyEmail},
		{"Ana@Example.COM", "ana@example.com", KeyEmail},
		{"+5511987654321", "+5511987654321", KeyPhone},
		{"529.982.247-25", "52998224725", KeyCPF},
		{"123E4567-E89B-42D3-A456-426614174000", "123e4567-e89b-42d3-a456-426614174000", KeyRandom},
		{"ana@", "", ""},
		{"@example.com", "", ""},
		{"ana@example", "", ""},
		{"ana@@example.com", "", ""},
		{"a na@example.com", "", ""},
		{"ana@-example.com", "", ""},
		{"+0511987654321", "", ""},
		{"+55 11 98765-4321", "", ""},
		{"+551", "", ""},
		{"11987654321", "", ""}, // a phone without + is not E.164 (and not a valid CPF)
		{"123e4567e89b42d3a456426614174000", "", ""},
		{"123e4567-e89b-42d3-a456-42661417400g", "", ""},
		{"", "", ""},
	}
	for _, tt := range tests {
		got, typ, err := ParseKey(tt.in)
		if got != tt.want || typ != tt.typ || (err == nil) != (tt.typ != "") {
			t.Errorf("ParseKey(%q) = %q, %q, %v; want %q, %q", tt.in, got, typ, err, tt.want, tt.typ)
		}
	}
}

func FuzzParseKey(f *testing.F) {
	for _, s := range []string{"ana@example.com", "+5511987654321", "52998224725", "123e4567-e89b-42d3-a456-426614174000"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, typ, err := ParseKey(s)
		if err != nil {
			return
		}
		again, typ2, err := ParseKey(got)
		if err != nil || again != got || typ2 != typ {
			t.Fatalf("ParseKey(%q) = %q (%s) but ParseKey of that = %q (%s), %v", s, got, typ, again, typ2, err)
		}
	})
}

// backends opens a fresh ledger with the demo accounts for each implementation: every ledger
// test runs against all of them.
func backends(t *testing.T) map[string]func(t *testing.T) Ledger {
	return map[string]func(t *testing.T) Ledger{
		"memory": func(t *testing.T) Ledger {
			l, err := NewMemoryLedger(demo())
			if err != nil {
				t.Fatal(err)
			}
			return l
		},
		"postgres": func(t *testing.T) Ledger {
			l, err := OpenPostgres(context.Background(), pgtest.URL(t), 0, demo())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(l.Close)
			return l
		},
	}
}

// forEachBackend runs test against every Ledger implementation.
func forEachBackend(t *testing.T, test func(t *testing.T, l Ledger)) {
	for name, open := range backends(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			test(t, open(t))
		})
	}
}

func TestTransferErrors(t *testing.T) {
	forEachBackend(t, func(t *testing.T, l Ledger) {
		ctx := context.Background()
		for _, tt := range []struct {
			req  TransferRequest
			want error
		}{
			{TransferRequest{From: "acct-diego", ToKey: "ana@example.com", AmountCents: 0}, ErrInvalidAmount},
			{TransferRequest{From: "acct-diego", ToKey: "ana@example.com", AmountCents: -5}, ErrInvalidAmount},
			{TransferRequest{From: "acct-diego", ToKey: "ana@example.com", AmountCents: MaxAmountCents + 1}, ErrInvalidAmount},
			{TransferRequest{From: "acct-diego", ToKey: "ana@example.com", AmountCents: math.MaxInt64}, ErrInvalidAmount},
			{TransferRequest{From: "acct-diego", ToKey: "nobody@example.com", AmountCents: 1}, ErrKeyNotFound},
			{TransferRequest{From: "acct-diego", ToKey: "diego@example.com", AmountCents: 1}, ErrSameAccount},
			{TransferRequest{From: "acct-diego", ToKey: "93541134780", AmountCents: 1}, ErrSameAccount},
			{TransferRequest{From: "acct-diego", ToKey: "ana@example.com", AmountCents: 100_001}, ErrInsufficientFunds},
			{TransferRequest{From: "acct-nobody", ToKey: "ana@example.com", AmountCents: 1}, ErrAccountNotFound},
			// A token for an account that no longer exists fails as such, whatever key it names.
			{TransferRequest{From: "acct-nobody", ToKey: "nobody@example.com", AmountCents: 1}, ErrAccountNotFound},
		} {
			tt.req.IdempotencyKey = newKey()
			if _, err := l.Transfer(ctx, tt.req); !errors.Is(err, tt.want) {
				t.Errorf("Transfer(%+v) = %v, want %v", tt.req, err, tt.want)
			}
		}
		st, err := l.Statement(ctx, "acct-diego", 10)
		if err != nil || st.BalanceCents != 100_000 || len(st.Entries) != 0 {
			t.Errorf("after only failed transfers: %+v, %v; want balance 100000, no entries", st, err)
		}
		if _, err := l.Transfer(ctx, TransferRequest{From: "acct-diego", ToKey: "ana@example.com", AmountCents: 1}); !errors.Is(err, ErrIdempotencyKeyRequired) {
			t.Errorf("a transfer without an idempotency key: %v, want ErrIdempotencyKeyRequired", err)
		}
		if _, err := l.Statement(ctx, "acct-nobody", 10); !errors.Is(err, ErrAccountNotFound) {
			t.Errorf("statement of no account: %v, want ErrAccountNotFound", err)
		}
	})
}

func TestTransferAndStatement(t *testing.T) {
	forEachBackend(t, func(t *testing.T, l Ledger) {
		ctx := context.Background()
		a, err := l.AccountByDocument(ctx, "52998224725")
		if err != nil || a.ID != "acct-ana" || len(a.PasswordHash) == 0 {
			t.Fatalf("AccountByDocument(Ana) = %+v, %v", a, err)
		}
		if _, err := l.AccountByDocument(ctx, "12345678909"); !errors.Is(err, ErrAccountNotFound) {
			t.Errorf("AccountByDocument(unknown) = %v, want ErrAccountNotFound", err)
		}
		var ids []string
		for i, amount := range []int64{100, 250, 400} {
			r, err := l.Transfer(ctx, TransferRequest{From: "acct-ana", ToKey: "+5511987654321", AmountCents: amount, Description: fmt.Sprint("n", i), IdempotencyKey: newKey()})
			if err != nil {
				t.Fatal(err)
			}
			if r.ToName != "Bruno Lima" || r.AmountCents != amount || len(r.EndToEndID) != 32 {
				t.Errorf("receipt %+v", r)
			}
			ids = append(ids, r.EndToEndID)
		}
		st, err := l.Statement(ctx, "acct-ana", 2)
		if err != nil {
			t.Fatal(err)
		}
		if st.BalanceCents != 1_000_000-750 || len(st.Entries) != 2 || st.Entries[0].EndToEndID != ids[2] || st.Entries[1].EndToEndID != ids[1] {
			t.Errorf("Ana's statement (limit 2) = %+v, want balance 999250 and the two newest, newest first", st)
		}
		if e := st.Entries[0]; e.Direction != Out || e.Counterparty != "Bruno Lima" || e.AmountCents != 400 || e.Description != "n2" {
			t.Errorf("Ana's newest entry = %+v", e)
		}
		bruno, _ := l.Statement(ctx, "acct-bruno", 50)
		if bruno.BalanceCents != 500_000+750 || len(bruno.Entries) != 3 || bruno.Entries[0].Direction != In || bruno.Entries[0].Counterparty != "Ana Souza" {
			t.Errorf("Bruno's statement = %+v", bruno)
		}
	})
}

func TestIdempotency(t *testing.T) {
	forEachBackend(t, func(t *testing.T, l Ledger) {
		ctx := context.Background()
		req := TransferRequest{From: "acct-carla", ToKey: "diego@example.com", AmountCents: 999, Description: "rent", IdempotencyKey: "k-1"}
		first, err := l.Transfer(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		again, err := l.Transfer(ctx, req)
		if err != nil || !again.Replayed || first.Replayed || !sameReceipt(again, first) {
			t.Errorf("replay = %+v, %v; want the original %+v, marked replayed", again, err, first)
		}
		for _, changed := range []TransferRequest{
			{From: "acct-carla", ToKey: "diego@example.com", AmountCents: 998, Description: "rent", IdempotencyKey: "k-1"},
			{From: "acct-carla", ToKey: "ana@example.com", AmountCents: 999, Description: "rent", IdempotencyKey: "k-1"},
			{From: "acct-carla", ToKey: "diego@example.com", AmountCents: 999, Description: "other", IdempotencyKey: "k-1"},
		} {
			if _, err := l.Transfer(ctx, changed); !errors.Is(err, ErrIdempotencyConflict) {
				t.Errorf("same key, different request %+v: %v, want ErrIdempotencyConflict", changed, err)
			}
		}
		// Keys are per paying account: Diego may use "k-1" too.
		if _, err := l.Transfer(ctx, TransferRequest{From: "acct-diego", ToKey: "carla@example.com", AmountCents: 1, IdempotencyKey: "k-1"}); err != nil {
			t.Errorf("another account's k-1: %v", err)
		}
		// Concurrent requests with one new key: one transfer, every answer its receipt.
		req.IdempotencyKey = "k-2"
		var wg sync.WaitGroup
		receipts := make([]Receipt, 10)
		for i := range receipts {
			wg.Go(func() {
				r, err := l.Transfer(ctx, req)
				if err != nil {
					t.Errorf("concurrent replay: %v", err)
				}
				receipts[i] = r
			})
		}
		wg.Wait()
		for _, r := range receipts {
			if !sameReceipt(r, receipts[0]) {
				t.Errorf("concurrent requests with one key got different receipts: %+v vs %+v", r, receipts[0])
			}
		}
		st, _ := l.Statement(ctx, "acct-carla", 50)
		if st.BalanceCents != 250_000-2*999+1 || len(st.Entries) != 3 {
			t.Errorf("Carla: balance %d with %d entries, want %d with 3: replays moved money", st.BalanceCents, len(st.Entries), 250_000-2*999+1)
		}
	})
}

// TestConcurrentRetriesOfATransferTheBalanceCoversOnce: a client that retries after a timeout
// sends the same request again while the first is still running. Diego's balance covers the
// amount once; every request with the key must get the original receipt, never
// ErrInsufficientFunds for a payment that went through.
func TestConcurrentRetriesOfATransferTheBalanceCoversOnce(t *testing.T) {
	forEachBackend(t, func(t *testing.T, l Ledger) {
		ctx := context.Background()
		req := TransferRequest{From: "acct-diego", ToKey: "ana@example.com", AmountCents: 60_000, IdempotencyKey: "retry-1"}
		receipts := make([]Receipt, 20)
		errs := make([]error, len(receipts))
		release := holdAccount(t, l, "acct-diego", 2) // so that the requests surely overlap
		var wg sync.WaitGroup
		for i := range receipts {
			wg.Go(func() { receipts[i], errs[i] = l.Transfer(ctx, req) })
		}
		release()
		wg.Wait()
		for i := range receipts {
			if errs[i] != nil || !sameReceipt(receipts[i], receipts[0]) {
				t.Errorf("request %d: %+v, %v; want the original receipt %+v", i, receipts[i], errs[i], receipts[0])
			}
		}
		if st, _ := l.Statement(ctx, "acct-diego", 50); st.BalanceCents != 40_000 || len(st.Entries) != 1 {
			t.Errorf("Diego: balance %d with %d entries, want 40000 with 1", st.BalanceCents, len(st.Entries))
		}
	})
}

// holdAccount locks an account's row in PostgreSQL, as a long transfer would, and returns the
// function that waits until at least waiters transactions are blocked behind it, then releases
// it. The memory ledger serializes transfers under one mutex, so there is nothing to hold.
func holdAccount(t *testing.T, l Ledger, id string, waiters int) (release func()) {
	t.Helper()
	pg, ok := l.(*PostgresLedger)
	if !ok {
		return func() {}
	}
	ctx := context.Background()
	tx, err := pg.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	failed := true
	defer func() {
		if failed { // a transaction left open would keep the ledger's Close waiting
			_ = tx.Rollback(ctx)
		}
	}()
	if _, err := tx.Exec(ctx, "SELECT 1 FROM accounts WHERE id = $1 FOR UPDATE", id); err != nil {
		t.Fatal(err)
	}
	watch, err := pgx.ConnectConfig(ctx, pg.pool.Config().ConnConfig.Copy())
	if err != nil {
		t.Fatal(err)
	}
	failed = false
	return func() {
		defer watch.Close(ctx)
		defer tx.Rollback(ctx) //nolint:errcheck // releasing is all that matters
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			var n int
			if err := watch.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n >= waiters {
				return
			}
		}
		t.Fatalf("fewer than %d transactions waited for %s's row within 10s", waiters, id)
	}
}

func TestConcurrentTransfersKeepTheBooks(t *testing.T) {
	forEachBackend(t, func(t *testing.T, l Ledger) {
		ctx := context.Background()
		accounts := demo()
		var wg sync.WaitGroup
		start := time.Now()
		for g := range 8 {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(g), 3))
				for range 100 {
					from, to := accounts[rng.IntN(4)], accounts[rng.IntN(4)]
					_, err := l.Transfer(ctx, TransferRequest{From: from.ID, ToKey: to.Keys[0], AmountCents: int64(1 + rng.IntN(60_000)), IdempotencyKey: newKey()})
					if err != nil && !errors.Is(err, ErrInsufficientFunds) && !errors.Is(err, ErrSameAccount) {
						t.Errorf("transfer: %v", err)
					}
				}
			})
		}
		wg.Wait()
		t.Logf("800 transfer attempts in %v (%.0f/s)", time.Since(start).Round(time.Millisecond), 800/time.Since(start).Seconds())
		var total int64
		legs := map[string][]Direction{}
		for _, a := range accounts {
			st, err := l.Statement(ctx, a.ID, 1<<20)
			if err != nil {
				t.Fatal(err)
			}
			sum := a.OpeningCents
			for i, e := range st.Entries {
				if i > 0 && e.CreatedAt.After(st.Entries[i-1].CreatedAt) {
					t.Errorf("%s: statement not newest first at %d", a.ID, i)
				}
				if e.Direction == In {
					sum += e.AmountCents
				} else {
					sum -= e.AmountCents
				}
				legs[e.EndToEndID] = append(legs[e.EndToEndID], e.Direction)
			}
			if sum != st.BalanceCents {
				t.Errorf("%s: opening + entries = %d, balance = %d", a.ID, sum, st.BalanceCents)
			}
			if st.BalanceCents < 0 {
				t.Errorf("%s: negative balance %d", a.ID, st.BalanceCents)
			}
			total += st.BalanceCents
		}
		opening := int64(0)
		for _, a := range demo() {
			opening += a.OpeningCents
		}
		if total != opening {
			t.Errorf("total %d, want %d (the opening balances)", total, opening)
		}
		for id, d := range legs {
			if len(d) != 2 || d[0] == d[1] {
				t.Errorf("transfer %s has legs %v, want one out and one in", id, d)
			}
		}
		if len(legs) < 300 {
			t.Errorf("only %d transfers succeeded: too few to prove anything", len(legs))
		}
	})
}

func TestPostgresSurvivesRestartsAndConcurrentStarts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.URL(t)
	var wg sync.WaitGroup
	for range 4 { // four replicas starting at once on an empty database
		wg.Go(func() {
			l, err := OpenPostgres(ctx, url, 0, demo())
			if err != nil {
				t.Errorf("concurrent start: %v", err)
				return
			}
			l.Close()
		})
	}
	wg.Wait()
	l, err := OpenPostgres(ctx, url, 0, demo())
	if err != nil {
		t.Fatal(err)
	}
	r, err := l.Transfer(ctx, TransferRequest{From: "acct-ana", ToKey: "diego@example.com", AmountCents: 5000, IdempotencyKey: "before-restart"})
	if err != nil {
		t.Fatal(err)
	}
	l.Close()

	l, err = OpenPostgres(ctx, url, 0, demo()) // seeding again changes nothing
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	st, err := l.Statement(ctx, "acct-ana", 10)
	if err != nil || st.BalanceCents != 1_000_000-5000 || len(st.Entries) != 1 || st.Entries[0].EndToEndID != r.EndToEndID {
		t.Errorf("after a restart: %+v, %v; want the transfer and its balance kept", st, err)
	}
	if again, err := l.Transfer(ctx, TransferRequest{From: "acct-ana", ToKey: "diego@example.com", AmountCents: 5000, IdempotencyKey: "before-restart"}); err != nil || !sameReceipt(again, r) {
		t.Errorf("replay after a restart = %+v, %v; want %+v", again, err, r)
	}
	files, _ := fs.Glob(migrations, "migrations/*.sql")
	var versions int
	if err := l.pool.QueryRow(ctx, "SELECT count(*) FROM schema_migrations").Scan(&versions); err != nil || versions != len(files) {
		t.Errorf("schema_migrations has %d rows (%v), want one per migration, %d: concurrent starts applied one twice", versions, err, len(files))
	}
}

// nightBackends opens each ledger with the default night cap and an injected clock.
func nightBackends(t *testing.T, clock func() time.Time) map[string]Ledger {
	night, err := DefaultNightCap()
	if err != nil {
		t.Fatal(err)
	}
	mem, err := NewMemoryLedger(demo(), WithNightCap(night), WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	pg, err := OpenPostgres(context.Background(), pgtest.URL(t), 0, demo(), WithNightCap(night), WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pg.Close)
	return map[string]Ledger{"memory": mem, "postgres": pg}
}

// TestNightCapEdges: the window's edges in São Paulo time, a night that spans midnight, and the
// answer that says how much is left.
func TestNightCapEdges(t *testing.T) {
	t.Parallel()
	sp, err := time.LoadLocation("America/Sao_Paulo")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, sp)
	set := func(h, m, s int, day int) { mu.Lock(); now = time.Date(2026, 11, day, h, m, s, 0, sp); mu.Unlock() }
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	for name, l := range nightBackends(t, clock) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			pay := func(cents int64) error {
				_, err := l.Transfer(ctx, TransferRequest{From: "acct-ana", ToKey: "bruno@example.com", AmountCents: cents, IdempotencyKey: newKey()})
				return err
			}
			set(19, 59, 59, 30) // day: no cap
			if err := pay(200_000); err != nil {
				t.Fatalf("R$ 2.000,00 at 19:59:59: %v, want no cap by day", err)
			}
			set(20, 0, 0, 30) // night begins: the day's transfer does not count
			if err := pay(90_000); err != nil {
				t.Fatalf("R$ 900,00 at 20:00:00: %v", err)
			}
			set(23, 30, 0, 30)
			var nl *NightLimitError
			if err := pay(20_000); !errors.As(err, &nl) || nl.RemainingCents != 10_000 || !errors.Is(err, ErrNightLimitExceeded) {
				t.Fatalf("R$ 200,00 more at 23:30: %v, want NightLimitError with R$ 100,00 left", err)
			}
			set(5, 59, 59, 31) // the same night, after midnight
			if err := pay(10_000); err != nil {
				t.Fatalf("the last R$ 100,00 at 05:59:59: %v", err)
			}
			if err := pay(1); !errors.Is(err, ErrNightLimitExceeded) {
				t.Fatalf("one more cent at 05:59:59: %v, want ErrNightLimitExceeded", err)
			}
			set(6, 0, 0, 31) // day again
			if err := pay(50_000); err != nil {
				t.Fatalf("at 06:00:00: %v, want no cap", err)
			}
			set(20, 0, 0, 31) // a new night, a new cap
			if err := pay(100_000); err != nil {
				t.Fatalf("a new night's R$ 1.000,00: %v", err)
			}
			st, _ := l.Statement(ctx, "acct-ana", 100)
			if want := int64(1_000_000 - 200_000 - 90_000 - 10_000 - 50_000 - 100_000); st.BalanceCents != want {
				t.Errorf("balance %d, want %d: a refused transfer moved money", st.BalanceCents, want)
			}
		})
	}
}

// TestNightCapUnderConcurrency: 20 transfers of R$ 100,00 at once at night: exactly 10 pass.
func TestNightCapUnderConcurrency(t *testing.T) {
	t.Parallel()
	sp, _ := time.LoadLocation("America/Sao_Paulo")
	night := time.Date(2026, 11, 30, 22, 0, 0, 0, sp)
	for name, l := range nightBackends(t, func() time.Time { return night }) {
		t.Run(name, func(t *testing.T) {
			var wg sync.WaitGroup
			var mu sync.Mutex
			results := map[string]int{}
			for range 20 {
				wg.Go(func() {
					_, err := l.Transfer(context.Background(), TransferRequest{From: "acct-bruno", ToKey: "carla@example.com", AmountCents: 10_000, IdempotencyKey: newKey()})
					mu.Lock()
					results[fmt.Sprint(errors.Is(err, ErrNightLimitExceeded), err == nil)]++
					mu.Unlock()
				})
			}
			wg.Wait()
			if results["false true"] != 10 || results["true false"] != 10 {
				t.Errorf("20 concurrent R$ 100,00 at night: %v, want 10 passed and 10 refused by the cap", results)
			}
		})
	}
}

// newKey is a fresh idempotency key, as a client makes one per transfer.
func newKey() string { return crand.Text() }

// TestNightCapCannotOverflow: spent + amount in int64 wrapped around below the cap
// (spent 1, amount MaxInt64); the cap compares without adding.
func TestNightCapCannotOverflow(t *testing.T) {
	n, err := DefaultNightCap()
	if err != nil {
		t.Fatal(err)
	}
	night := time.Date(2026, 11, 30, 23, 0, 0, 0, n.Location)
	for _, tt := range []struct {
		spent, amount int64
		ok            bool
	}{
		{1, math.MaxInt64, false},
		{math.MaxInt64, math.MaxInt64, false},
		{99_999, 1, true},
		{99_999, 2, false},
		{0, 100_000, true},
	} {
		if got := n.check(night, tt.spent, tt.amount) == nil; got != tt.ok {
			t.Errorf("check(spent %d, amount %d) allowed %t, want %t", tt.spent, tt.amount, got, tt.ok)
		}
	}
}

// sameReceipt reports whether two receipts are of one transfer, whether or not either is a
// replay.
func sameReceipt(a, b Receipt) bool {
	a.Replayed, b.Replayed = false, false
	return a == b
}

// gatedLedger is a PostgreSQL ledger with timeout, reached through a pgtest.Gate.
func gatedLedger(t *testing.T, timeout time.Duration) (*PostgresLedger, *pgtest.Gate) {
	t.Helper()
	gate := pgtest.NewGate(t, pgtest.URL(t))
	l, err := OpenPostgres(context.Background(), gate.URL, timeout, demo())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	t.Cleanup(gate.Release) // before the ledger closes: a stranded connection waits out pgx's close
	return l, gate
}

// idleConnections leaves n connections idle in l's pool (at most its size): it holds n at once,
// then gives them back. It is the test's set-up, not what it proves: a dial that the ledger's
// short connect timeout cuts on a loaded machine (six backends forked at once beside two CPU
// burners took longer than 300 ms) is tried again, for up to 30 s.
func idleConnections(t *testing.T, l *PostgresLedger, n int) {
	t.Helper()
	n = min(n, int(l.pool.Config().MaxConns))
	held := make(chan *pgxpool.Conn, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			var err error
			for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
				var c *pgxpool.Conn
				if c, err = l.pool.Acquire(context.Background()); err == nil {
					held <- c
					return
				}
			}
			t.Error(err)
		})
	}
	wg.Wait()
	close(held)
	for c := range held {
		c.Release()
	}
}

// answersWithin pings l until it answers, failing t if that takes longer than within.
func answersWithin(t *testing.T, l *PostgresLedger, within time.Duration) {
	t.Helper()
	back := time.Now()
	for {
		err := l.Ping(context.Background())
		if err == nil {
			t.Logf("answered %v after the network came back", time.Since(back).Round(time.Millisecond))
			return
		}
		if time.Since(back) > within {
			st := l.pool.Stat()
			t.Fatalf("no answer %v after the network came back: %v (pool: %d acquired, %d idle, %d dialling)",
				time.Since(back).Round(time.Millisecond), err, st.AcquiredConns(), st.IdleConns(), st.ConstructingConns())
		}
	}
}

// TestAFailedPingDropsTheDeadConnections: after a network cut every idle connection of the pool
// is dead (Gate.Strand: no answer, no hang-up). The first ping waits out its timeout on one of
// them and resets the pool; the next dials afresh and answers at once, instead of taking the next
// dead connection, as it would one by one without the reset.
func TestAFailedPingDropsTheDeadConnections(t *testing.T) {
	t.Parallel()
	const timeout = time.Second // a fresh dial and its authentication fit in it beside four CPU burners (300 ms did not)
	l, gate := gatedLedger(t, timeout)
	idleConnections(t, l, 6)
	if idle := l.pool.Stat().IdleConns(); idle < 4 {
		t.Fatalf("%d idle connections, want several", idle)
	}
	gate.Strand()
	start := time.Now()
	// With a deadline of the caller's shorter than the ledger's, as /readyz gives its probes.
	ctx, cancel := context.WithTimeout(context.Background(), timeout/2)
	defer cancel()
	if err := l.Ping(ctx); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("a ping over a dead connection: %v after %v, want ErrUnavailable", err, time.Since(start))
	}
	for i := range 3 {
		start := time.Now()
		if err := l.Ping(context.Background()); err != nil {
			t.Fatalf("ping %d after the reset: %v after %v, want an answer over a new connection", i+1, err, time.Since(start))
		}
	}
}

// TestADialThatHangsDoesNotHoldThePool: during a cut that drops packets (Gate.Blackhole) every
// new connection hangs in its start-up, and pgxpool dials in the background, detached from the
// caller's deadline: without a connect timeout those dials hold every place in the pool, and
// once the network is back the pool still waits for them. With the ledger's connect timeout
// they give up, and the pool answers within about that timeout of the network's return.
func TestADialThatHangsDoesNotHoldThePool(t *testing.T) {
	t.Parallel()
	const timeout = 300 * time.Millisecond
	l, gate := gatedLedger(t, timeout)
	gate.Blackhole()
	for i := range 2 * int(l.pool.Config().MaxConns) { // more dials than the pool has places
		if err := l.Ping(context.Background()); !errors.Is(err, ErrUnavailable) {
			t.Fatalf("ping %d during the cut: %v, want ErrUnavailable", i+1, err)
		}
	}
	gate.Open() // the network is back; what was sent during the cut stays lost
	answersWithin(t, l, 4*timeout)
}

// TestABrokenConnectionGivesItsPlaceBackSoon: every place of the pool is in a call when the
// database becomes unreachable; each call's deadline breaks its connection, and pgx cleans a
// broken connection up (a cancel request, then reading what the server still sends) for up to
// 15 s, during which pgxpool keeps its place. With the connections' deadlines bounded by the
// ledger's timeout, the pool answers within about that timeout of the network's return, not
// 15 s later (deploy/e2e.sh's cut drill, before: the pool 4 acquired, 0 idle, 0 dialling).
func TestABrokenConnectionGivesItsPlaceBackSoon(t *testing.T) {
	t.Parallel()
	const timeout = 300 * time.Millisecond
	l, gate := gatedLedger(t, timeout)
	n := int(l.pool.Config().MaxConns)
	idleConnections(t, l, n) // every place holds an idle connection
	gate.Unreachable()
	var wg sync.WaitGroup
	for range n { // and each is in a call when the route goes
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			if _, err := l.pool.Exec(ctx, "SELECT 1"); err == nil {
				t.Error("a call over an unreachable database answered")
			}
		})
	}
	wg.Wait()
	gate.Open()
	answersWithin(t, l, 2*time.Second)
}

// TestALostCommitFreesThePayer: a COMMIT lost on the way (Gate.StrandCommits: never sent, its
// connection left open, as across a path that went dead) leaves its transaction open in the
// server, with the payer's row lock. The transfer is answered ErrOutcomeUnknown; the server ends
// the idle transaction within the ledger's timeout, so the payer's next PIX and the honest retry
// go through (the retry making the transfer once), not after TCP keepalive, hours later.
func TestALostCommitFreesThePayer(t *testing.T) {
	t.Parallel()
	const timeout = 300 * time.Millisecond
	l, gate := gatedLedger(t, timeout)
	ctx := context.Background()
	before, err := l.Statement(ctx, "acct-ana", 1)
	if err != nil {
		t.Fatal(err)
	}
	lost := TransferRequest{From: "acct-ana", ToKey: "bruno@example.com", AmountCents: 100, IdempotencyKey: newKey()}
	gate.HoldCommits()
	if _, err := l.Transfer(ctx, lost); !errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("a transfer whose COMMIT is held: %v, want ErrOutcomeUnknown", err)
	}
	gate.StrandCommits()
	start := time.Now()
	next := TransferRequest{From: "acct-ana", ToKey: "carla@example.com", AmountCents: 100, IdempotencyKey: newKey()}
	for {
		_, err := l.Transfer(ctx, next)
		if err == nil {
			break
		}
		if !errors.Is(err, ErrUnavailable) || time.Since(start) > 10*time.Second {
			t.Fatalf("the payer's next PIX, %v after the lost COMMIT: %v", time.Since(start).Round(time.Millisecond), err)
		}
	}
	t.Logf("the payer's next PIX went through %v after the lost COMMIT", time.Since(start).Round(time.Millisecond))
	r, err := l.Transfer(ctx, lost)
	if err != nil || r.Replayed {
		t.Fatalf("the retry of the lost transfer: %+v, %v, want it made now (the lost one rolled back)", r, err)
	}
	after, err := l.Statement(ctx, "acct-ana", 1)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := after.BalanceCents, before.BalanceCents-200; got != want {
		t.Errorf("balance %d, want %d: the lost transfer once, by its retry, and the next", got, want)
	}
}

// demo is DemoAccounts with their published hashes: a ledger stores a hash and never checks it,
// so none is made.
func demo() []Account {
	accounts, err := DemoAccounts(bcrypt.DefaultCost)
	if err != nil {
		panic(err) // the published hashes need no hashing: no error
	}
	return accounts
}

// TestBusyWhenEveryConnectionIsInUse: the ledger is busy exactly while its pool holds its most
// connections and none is idle.
func TestBusyWhenEveryConnectionIsInUse(t *testing.T) {
	t.Parallel()
	l, _ := gatedLedger(t, time.Second)
	if l.Busy() {
		t.Fatal("busy before any call")
	}
	held := make([]*pgxpool.Conn, l.pool.Config().MaxConns)
	t.Cleanup(func() { // a held connection would keep the ledger's Close waiting
		for _, c := range held {
			if c != nil {
				c.Release()
			}
		}
	})
	for i := range held {
		c, err := l.pool.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		held[i] = c
		if got, want := l.Busy(), i == len(held)-1; got != want {
			t.Fatalf("%d of %d connections in use: busy %v, want %v", i+1, len(held), got, want)
		}
	}
	held[0].Release()
	held[0] = nil
	if l.Busy() {
		t.Error("busy with a connection idle")
	}
}

// TestTheMemoryLedgerBoundsItsCalls: the in-memory ledger serves MemoryCalls transfers and
// statements at once, as a pool would: busy when all are taken, and a call past them waits for a
// place, up to its deadline.
func TestTheMemoryLedgerBoundsItsCalls(t *testing.T) {
	t.Parallel()
	l, err := NewMemoryLedger(demo())
	if err != nil {
		t.Fatal(err)
	}
	var releases []func()
	for range MemoryCalls {
		release, err := l.call(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		releases = append(releases, release)
	}
	if !l.Busy() {
		t.Error("not busy with every place taken")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := l.Statement(ctx, "acct-ana", 1); !errors.Is(err, ErrUnavailable) {
		t.Errorf("a statement past the bound: %v, want ErrUnavailable at its deadline", err)
	}
	releases[0]()
	if l.Busy() {
		t.Error("busy with a place free")
	}
	if _, err := l.Statement(context.Background(), "acct-ana", 1); err != nil {
		t.Errorf("a statement with a place free: %v", err)
	}
	for _, r := range releases[1:] {
		r()
	}
}

// TestAReadOnlyDatabaseIsNotReadyAndRecovers: a database made read-only (as a demoted primary, or
// default_transaction_read_only set for it) fails Ping, and a transfer is ErrUnavailable with
// nothing moved; once writable again, Ping passes and a transfer goes through within a few
// tries, without a restart: the connections opened while it was read-only, which keep the setting
// for their lives, are closed when told so (25006), not kept for the pool's hour.
func TestAReadOnlyDatabaseIsNotReadyAndRecovers(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	l, err := OpenPostgres(context.Background(), url, 0, demo())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	admin := pgtest.Connect(t, url)
	var db string
	if err := admin.QueryRow(t.Context(), "SELECT current_database()").Scan(&db); err != nil {
		t.Fatal(err)
	}
	set := func(sql string) {
		t.Helper()
		if _, err := admin.Exec(t.Context(), sql); err != nil {
			t.Fatal(err)
		}
		// The setting is read at connect: end the ledger's connections, as a failover does.
		if _, err := admin.Exec(t.Context(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid()`); err != nil {
			t.Fatal(err)
		}
	}
	transfer := func(key string) error {
		_, err := l.Transfer(context.Background(), TransferRequest{From: "acct-ana", ToKey: "bruno@example.com", AmountCents: 100, IdempotencyKey: key})
		return err
	}
	set("ALTER DATABASE " + pgx.Identifier{db}.Sanitize() + " SET default_transaction_read_only = on")
	var err1 error
	for range 3 { // the first calls may meet connections the termination broke
		if err1 = l.Ping(context.Background()); errors.Is(err1, ErrUnavailable) && strings.Contains(err1.Error(), "read-only") {
			break
		}
	}
	if !errors.Is(err1, ErrUnavailable) || !strings.Contains(err1.Error(), "read-only") {
		t.Fatalf("Ping of a read-only database: %v, want ErrUnavailable saying read-only", err1)
	}
	for i := range 3 {
		if err := transfer(fmt.Sprint("ro-", i)); !errors.Is(err, ErrUnavailable) {
			t.Fatalf("a transfer on a read-only database: %v, want ErrUnavailable", err)
		}
	}
	if _, err := admin.Exec(t.Context(), "ALTER DATABASE "+pgx.Identifier{db}.Sanitize()+" RESET default_transaction_read_only"); err != nil {
		t.Fatal(err)
	}
	// Writable again, for new connections: the pool's, opened read-only, each fail once at most.
	var err2 error
	for i := range int(l.pool.Config().MaxConns) + 2 {
		if err2 = transfer(fmt.Sprint("rw-", i)); err2 == nil {
			break
		}
	}
	if err2 != nil {
		t.Fatalf("a transfer once the database is writable again: %v, want it made within the pool's size of tries", err2)
	}
	if err := l.Ping(context.Background()); err != nil {
		t.Errorf("Ping of a writable database: %v", err)
	}
}

// TestWhichServerErrorsAreUnavailable: a server error that says the database cannot serve now (a
// full disk, too many connections, a shutdown, a standby, a deadline) is ErrUnavailable, a 503
// the client may retry; one that says the request or the code is wrong is not (a 500).
// TestAFullDiskMovesNoMoney (cmd/api) fills a real server's disk, as root.
func TestWhichServerErrorsAreUnavailable(t *testing.T) {
	for code, want := range map[string]bool{
		"53100": true, "53200": true, "53300": true, "08006": true, "57P01": true, "57P03": true,
		"57014": true, "25006": true, "40001": true, "40P01": true, "55P03": true, "58030": true,
		"23505": false, "42P01": false, "22003": false, "42601": false,
	} {
		err := unavailable(fmt.Errorf("transfer: %w", &pgconn.PgError{Code: code}))
		if got := errors.Is(err, ErrUnavailable); got != want {
			t.Errorf("SQLSTATE %s: unavailable %v, want %v", code, got, want)
		}
	}
}

// TestEndToEndIDFormat: "E", the ISPB, the UTC minute (a PIX at 23:30 in São Paulo is the next
// day's 02:30 UTC) and 11 alphanumerics, 32 characters, as the central bank's id reads; and no
// two of a thousand made in one minute alike.
func TestEndToEndIDFormat(t *testing.T) {
	t.Parallel()
	brt := time.FixedZone("BRT", -3*60*60)
	now := time.Date(2026, 12, 1, 23, 30, 59, 0, brt)
	format := regexp.MustCompile(`^E` + ISPB + `202612020230[A-Za-z0-9]{11}$`)
	seen := map[string]bool{}
	for range 1000 {
		id := NewEndToEndID(now)
		if !format.MatchString(id) || len(id) != 32 {
			t.Fatalf("NewEndToEndID(%v) = %q, want E%s202612020230 and 11 alphanumerics, 32 characters", now, id, ISPB)
		}
		if seen[id] {
			t.Fatalf("NewEndToEndID made %q twice", id)
		}
		seen[id] = true
	}
}

// TestWhichErrorsRefusedAStatement: an error the server answered a statement with (at COMMIT: a
// roll-back) is told from one that ended the session by its unlocalized severity, so that a
// Portuguese lc_messages ("ERRO") does not make a refused COMMIT an unknown outcome.
func TestWhichErrorsRefusedAStatement(t *testing.T) {
	for _, tt := range []struct {
		e    pgconn.PgError
		want bool
	}{
		{pgconn.PgError{Severity: "ERROR", SeverityUnlocalized: "ERROR"}, true},
		{pgconn.PgError{Severity: "ERRO", SeverityUnlocalized: "ERROR"}, true},
		{pgconn.PgError{Severity: "ERROR"}, true}, // a server before 9.6 sends no unlocalized severity
		{pgconn.PgError{Severity: "FATAL", SeverityUnlocalized: "FATAL"}, false},
		{pgconn.PgError{Severity: "FATAL"}, false},
	} {
		if got := refused(&tt.e); got != tt.want {
			t.Errorf("refused(%q, %q) = %v, want %v", tt.e.Severity, tt.e.SeverityUnlocalized, got, tt.want)
		}
	}
}

// TestABusyPoolIsReady: with every connection of the pool at work, a ping (as /readyz sends,
// with a deadline shorter than the ledger's) finds none free: it answers ready, and resets
// nothing, so the connections at work are kept when they come back. Before, such a ping
// answered the database down and dropped the pool, every replica's at once under one hot payee.
func TestABusyPoolIsReady(t *testing.T) {
	t.Parallel()
	l, err := OpenPostgres(context.Background(), pgtest.URL(t), time.Second, demo())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	n := int(l.pool.Config().MaxConns)
	idleConnections(t, l, n)
	held := make([]*pgxpool.Conn, n)
	for i := range held {
		if held[i], err = l.pool.Acquire(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := l.Ping(ctx); err != nil {
		t.Errorf("a ping with every connection at work: %v, want ready", err)
	}
	for _, c := range held {
		c.Release()
	}
	if got := l.pool.Stat().TotalConns(); got != int32(n) {
		t.Errorf("%d connections after the busy ping, want the %d at work kept", got, n)
	}
	if err := l.Ping(context.Background()); err != nil {
		t.Errorf("a ping with the connections back: %v", err)
	}
}
