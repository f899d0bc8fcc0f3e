package pix

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pixlimit/pixlimit/internal/testing/pgtest"
)

// rulesBackends are both ledgers with the demo accounts under r and clock.
func rulesBackends(t *testing.T, r Rules, clock func() time.Time) map[string]Ledger {
	t.Helper()
	mem, err := NewMemoryLedger(demo(), WithRules(r), WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	// A generous budget: twenty transfers of one payer wait for its row lock one after another
	// (TestMoneyLimitsUnderConcurrency), and on a machine beside four CPU burners the last of them
	// once outwaited the default 2 s. A timeout is not what these tests test.
	pg, err := OpenPostgres(context.Background(), pgtest.URL(t), 10*time.Second, demo(), WithRules(r), WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pg.Close)
	return map[string]Ledger{"memory": mem, "postgres": pg}
}

// testClock is a settable clock.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time          { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *testClock) Set(t time.Time)         { c.mu.Lock(); c.now = t; c.mu.Unlock() }
func (c *testClock) Advance(d time.Duration) { c.mu.Lock(); c.now = c.now.Add(d); c.mu.Unlock() }

// defaultRules are the bank's defaults of the contract, the day limit R$ 10.000,00.
func defaultRules(t *testing.T) Rules {
	night, err := DefaultNightCap()
	if err != nil {
		t.Fatal(err)
	}
	return Rules{Night: night, DayLimitCents: 1_000_000, NewDeviceTransferCents: 20_000, NewDeviceDayCents: 100_000, IncreaseDelay: 24 * time.Hour}
}

// pay sends a transfer from from to key from device (registered or not).
func pay(l Ledger, from, key, device string, cents int64) error {
	_, err := l.Transfer(context.Background(), TransferRequest{From: from, ToKey: key, AmountCents: cents, IdempotencyKey: newKey(), Device: device})
	return err
}

// TestNightCapIsBetweenPersonsOnly: at night Bruno (PF) may send Ana (PF) R$ 1.000,00 in all, but
// pays the bakery (PJ) beyond it, and the bakery pays a person beyond it too; his payments to
// the bakery do not count against the persons' cap.
func TestNightCapIsBetweenPersonsOnly(t *testing.T) {
	t.Parallel()
	r := defaultRules(t)
	r.DayLimitCents, r.NewDeviceTransferCents, r.NewDeviceDayCents = 0, 0, 0
	clock := &testClock{now: time.Date(2026, 11, 30, 22, 0, 0, 0, r.Night.Location)}
	for name, l := range rulesBackends(t, r, clock.Now) {
		t.Run(name, func(t *testing.T) {
			clock.Set(time.Date(2026, 11, 30, 22, 0, 0, 0, r.Night.Location)) // each ledger starts at the same moment
			if err := pay(l, "acct-bruno", "padaria@example.com", "", 150_000); err != nil {
				t.Fatalf("Bruno pays the bakery R$ 1.500,00 at night: %v, want no cap (PF to PJ)", err)
			}
			if err := pay(l, "acct-bruno", "ana@example.com", "", 100_000); err != nil {
				t.Fatalf("then Ana R$ 1.000,00: %v, want the whole cap left (the bakery's payment does not count)", err)
			}
			if err := pay(l, "acct-bruno", "ana@example.com", "", 1); !errors.Is(err, ErrNightLimitExceeded) {
				t.Fatalf("one cent more to Ana: %v, want ErrNightLimitExceeded", err)
			}
			if err := pay(l, "acct-padaria", "carla@example.com", "", 300_000); err != nil {
				t.Fatalf("the bakery pays Carla R$ 3.000,00 at night: %v, want no cap (PJ to PF)", err)
			}
			if err := pay(l, "acct-cafe", "padaria@example.com", "", 300_000); err != nil {
				t.Fatalf("the café pays the bakery at night: %v, want no cap (PJ to PJ)", err)
			}
		})
	}
}

// TestCustomerLimits: a lower limit applies at once; a higher one is pending for exactly
// IncreaseDelay (refused until then, applied from then), cancellable, and a later night start
// is a looser one; bad values change nothing.
func TestCustomerLimits(t *testing.T) {
	t.Parallel()
	r := defaultRules(t)
	r.NewDeviceTransferCents, r.NewDeviceDayCents, r.IncreaseDelay = 0, 0, time.Hour
	clock := &testClock{}
	for name, l := range rulesBackends(t, r, clock.Now) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			clock.Set(time.Date(2026, 11, 30, 21, 0, 0, 0, r.Night.Location)) // night
			got, err := l.Limits(ctx, "acct-diego")
			if err != nil || got.NightLimitCents != 100_000 || got.DayLimitCents != 1_000_000 || got.NightStart != 20*time.Hour || len(got.Pending) != 0 {
				t.Fatalf("the defaults: %+v, %v", got, err)
			}
			lower, higher := int64(30_000), int64(500_000)
			if got, err = l.SetLimits(ctx, "acct-diego", MoneyLimitsChange{NightLimitCents: &lower}); err != nil || got.NightLimitCents != 30_000 || len(got.Pending) != 0 {
				t.Fatalf("lowering the night limit: %+v, %v, want R$ 300,00 at once", got, err)
			}
			if err := pay(l, "acct-diego", "ana@example.com", "", 30_001); !errors.Is(err, ErrNightLimitExceeded) {
				t.Fatalf("R$ 300,01 after lowering to R$ 300,00: %v, want refused", err)
			}
			requested := clock.Now()
			got, err = l.SetLimits(ctx, "acct-diego", MoneyLimitsChange{NightLimitCents: &higher})
			if err != nil || got.NightLimitCents != 30_000 || len(got.Pending) != 1 || got.Pending[0].Field != FieldNightLimit ||
				got.Pending[0].Value != higher || !got.Pending[0].EffectiveAt.Equal(requested.Add(time.Hour)) {
				t.Fatalf("raising it: %+v, %v, want R$ 300,00 in force and R$ 5.000,00 pending an hour", got, err)
			}
			clock.Advance(time.Hour - time.Microsecond)
			if err := pay(l, "acct-diego", "ana@example.com", "", 40_000); !errors.Is(err, ErrNightLimitExceeded) {
				t.Fatalf("R$ 400,00 a microsecond before the increase applies: %v, want refused", err)
			}
			clock.Advance(time.Microsecond)
			if err := pay(l, "acct-diego", "ana@example.com", "", 40_000); err != nil {
				t.Fatalf("R$ 400,00 when the increase applies: %v", err)
			}
			if got, _ := l.Limits(ctx, "acct-diego"); got.NightLimitCents != higher || len(got.Pending) != 0 {
				t.Fatalf("after the delay: %+v, want R$ 5.000,00 in force and nothing pending", got)
			}

			// Cancelling: a pending increase never applies.
			day := int64(2_000_000)
			if got, _ := l.SetLimits(ctx, "acct-diego", MoneyLimitsChange{DayLimitCents: &day}); len(got.Pending) != 1 || got.DayLimitCents != 1_000_000 {
				t.Fatalf("raising the day limit: %+v, want it pending", got)
			}
			if got, err := l.CancelPendingLimits(ctx, "acct-diego"); err != nil || len(got.Pending) != 0 {
				t.Fatalf("cancelling: %+v, %v", got, err)
			}
			clock.Advance(2 * time.Hour)
			if got, _ := l.Limits(ctx, "acct-diego"); got.DayLimitCents != 1_000_000 {
				t.Fatalf("after a cancelled increase's delay: day limit %d, want 1000000", got.DayLimitCents)
			}

			// The night's start: 22:00 shortens the night (looser: pending), 20:00 again is at once.
			late, early := 22*time.Hour, 20*time.Hour
			if got, _ := l.SetLimits(ctx, "acct-carla", MoneyLimitsChange{NightStart: &late}); got.NightStart != 20*time.Hour || len(got.Pending) != 1 {
				t.Fatalf("a night from 22:00: %+v, want pending", got)
			}
			clock.Advance(time.Hour)
			if got, _ := l.Limits(ctx, "acct-carla"); got.NightStart != 22*time.Hour {
				t.Fatalf("after the delay: night from %v, want 22h", got.NightStart)
			}
			if got, _ := l.SetLimits(ctx, "acct-carla", MoneyLimitsChange{NightStart: &early}); got.NightStart != 20*time.Hour || len(got.Pending) != 0 {
				t.Fatalf("back to 20:00: %+v, want at once", got)
			}

			// Invalid values: nothing changes.
			before, _ := l.Limits(ctx, "acct-ana")
			negative, huge, odd := int64(-1), int64(MaxLimitCents+1), 21*time.Hour
			for _, c := range []MoneyLimitsChange{{NightLimitCents: &negative}, {DayLimitCents: &huge}, {NightStart: &odd}, {NightLimitCents: &lower, DayLimitCents: &negative}} {
				var le *MoneyLimitsError
				if _, err := l.SetLimits(ctx, "acct-ana", c); !errors.As(err, &le) || !errors.Is(err, ErrInvalidLimits) {
					t.Errorf("SetLimits(%+v): %v, want a MoneyLimitsError", c, err)
				}
			}
			if after, _ := l.Limits(ctx, "acct-ana"); fmt.Sprint(after) != fmt.Sprint(before) {
				t.Errorf("after invalid changes: %+v, want %+v", after, before)
			}
			if _, err := l.SetLimits(ctx, "acct-nobody", MoneyLimitsChange{NightLimitCents: &lower}); !errors.Is(err, ErrAccountNotFound) {
				t.Errorf("an unknown account: %v", err)
			}
		})
	}
}

// TestCustomerNightStartsAt22: Ana's night from 22:00: at 21:00 she is not capped, at 22:00 she is.
func TestCustomerNightStartsAt22(t *testing.T) {
	t.Parallel()
	r := defaultRules(t)
	r.NewDeviceTransferCents, r.NewDeviceDayCents, r.IncreaseDelay = 0, 0, time.Minute
	clock := &testClock{now: time.Date(2026, 11, 30, 12, 0, 0, 0, r.Night.Location)}
	for name, l := range rulesBackends(t, r, clock.Now) {
		t.Run(name, func(t *testing.T) {
			clock.Set(time.Date(2026, 11, 30, 12, 0, 0, 0, r.Night.Location)) // each ledger starts at the same moment
			late := 22 * time.Hour
			if _, err := l.SetLimits(context.Background(), "acct-ana", MoneyLimitsChange{NightStart: &late}); err != nil {
				t.Fatal(err)
			}
			clock.Set(time.Date(2026, 11, 30, 21, 0, 0, 0, r.Night.Location))
			if err := pay(l, "acct-ana", "bruno@example.com", "", 150_000); err != nil {
				t.Fatalf("R$ 1.500,00 at 21:00 with the night from 22:00: %v", err)
			}
			clock.Set(time.Date(2026, 11, 30, 22, 0, 0, 0, r.Night.Location))
			if err := pay(l, "acct-ana", "bruno@example.com", "", 150_000); !errors.Is(err, ErrNightLimitExceeded) {
				t.Fatalf("R$ 1.500,00 at 22:00: %v, want the night cap", err)
			}
		})
	}
}

// TestDayLimit: the day's transfers sum to the day limit, to persons and companies alike, and a
// new São Paulo day starts afresh.
func TestDayLimit(t *testing.T) {
	t.Parallel()
	r := defaultRules(t)
	r.Night.LimitCents, r.NewDeviceTransferCents, r.NewDeviceDayCents, r.DayLimitCents = 0, 0, 0, 300_000
	clock := &testClock{now: time.Date(2026, 11, 30, 10, 0, 0, 0, r.Night.Location)}
	for name, l := range rulesBackends(t, r, clock.Now) {
		t.Run(name, func(t *testing.T) {
			clock.Set(time.Date(2026, 11, 30, 10, 0, 0, 0, r.Night.Location)) // each ledger starts at the same moment
			if err := pay(l, "acct-ana", "padaria@example.com", "", 200_000); err != nil {
				t.Fatal(err)
			}
			var de *DayLimitError
			if err := pay(l, "acct-ana", "bruno@example.com", "", 100_001); !errors.As(err, &de) || de.RemainingCents != 100_000 {
				t.Fatalf("R$ 1.000,01 with R$ 1.000,00 left today: %v, want DayLimitError with 100000 left", err)
			}
			if err := pay(l, "acct-ana", "bruno@example.com", "", 100_000); err != nil {
				t.Fatalf("the rest of the day: %v", err)
			}
			clock.Set(time.Date(2026, 12, 1, 0, 0, 0, 0, r.Night.Location))
			if err := pay(l, "acct-ana", "bruno@example.com", "", 300_000); err != nil {
				t.Fatalf("a new day at midnight in São Paulo: %v", err)
			}
		})
	}
}

// TestNewDevices: an unregistered device sends at most R$ 200,00 a transfer and R$ 1.000,00 a
// day in all (over every unregistered device), while a registered device is not capped; a replay
// of a transfer that passed is never refused.
func TestNewDevices(t *testing.T) {
	t.Parallel()
	r := defaultRules(t)
	r.Night.LimitCents, r.DayLimitCents = 0, 0
	clock := &testClock{now: time.Date(2026, 11, 30, 10, 0, 0, 0, r.Night.Location)}
	for name, l := range rulesBackends(t, r, clock.Now) {
		t.Run(name, func(t *testing.T) {
			clock.Set(time.Date(2026, 11, 30, 10, 0, 0, 0, r.Night.Location)) // each ledger starts at the same moment
			ctx := context.Background()
			var dle *DeviceLimitError
			if err := pay(l, "acct-ana", "bruno@example.com", "phone-new", 20_001); !errors.As(err, &dle) || !dle.PerTransfer {
				t.Fatalf("R$ 200,01 from a new device: %v, want DeviceLimitError per transfer", err)
			}
			req := TransferRequest{From: "acct-ana", ToKey: "bruno@example.com", AmountCents: 20_000, IdempotencyKey: newKey(), Device: "phone-new"}
			if _, err := l.Transfer(ctx, req); err != nil {
				t.Fatal(err)
			}
			for i := range 3 { // 4 × R$ 200,00 = R$ 800,00, over two new devices
				if err := pay(l, "acct-ana", "bruno@example.com", fmt.Sprint("laptop-", i%2), 20_000); err != nil {
					t.Fatal(err)
				}
			}
			if err := pay(l, "acct-ana", "bruno@example.com", "", 20_001); !errors.As(err, &dle) || dle.RemainingCents != 20_000 {
				t.Fatalf("R$ 200,01 with R$ 200,00 left: %v, want DeviceLimitError with 20000 left", err)
			}
			if err := pay(l, "acct-ana", "bruno@example.com", "", 20_000); err != nil {
				t.Fatalf("the day's last R$ 200,00 from unknown devices: %v", err)
			}
			if err := pay(l, "acct-ana", "bruno@example.com", "phone-new", 1); !errors.As(err, &dle) || dle.RemainingCents != 0 {
				t.Fatalf("a cent more: %v, want DeviceLimitError with nothing left", err)
			}
			if again, err := l.Transfer(ctx, req); err != nil || !again.Replayed {
				t.Fatalf("the replay of a transfer that passed: %+v, %v, want its receipt", again, err)
			}
			if _, err := l.RegisterDevice(ctx, "acct-ana", "phone-own", 0); err != nil {
				t.Fatal(err)
			}
			if _, err := l.RegisterDevice(ctx, "acct-ana", "phone-own", 0); err != nil {
				t.Fatalf("registering twice: %v", err)
			}
			if err := pay(l, "acct-ana", "bruno@example.com", "phone-own", 300_000); err != nil {
				t.Fatalf("R$ 3.000,00 from a registered device: %v", err)
			}
			if err := pay(l, "acct-bruno", "ana@example.com", "phone-own", 20_001); !errors.As(err, &dle) {
				t.Fatalf("Ana's registered device for Bruno's account: %v, want it new there", err)
			}
			if _, err := l.RegisterDevice(ctx, "acct-nobody", "x", 0); !errors.Is(err, ErrAccountNotFound) {
				t.Errorf("registering for an unknown account: %v", err)
			}
			clock.Advance(24 * time.Hour)
			if err := pay(l, "acct-ana", "bruno@example.com", "phone-new", 20_000); err != nil {
				t.Fatalf("the next day from the new device: %v", err)
			}
		})
	}
}

// TestMoneyLimitsUnderConcurrency: 20 transfers of R$ 100,00 at once from one unregistered
// device: exactly 10 pass its R$ 1.000,00 a day, on both ledgers.
func TestMoneyLimitsUnderConcurrency(t *testing.T) {
	t.Parallel()
	r := defaultRules(t)
	r.Night.LimitCents, r.DayLimitCents = 0, 0
	clock := &testClock{now: time.Date(2026, 11, 30, 10, 0, 0, 0, r.Night.Location)}
	for name, l := range rulesBackends(t, r, clock.Now) {
		t.Run(name, func(t *testing.T) {
			clock.Set(time.Date(2026, 11, 30, 10, 0, 0, 0, r.Night.Location)) // each ledger starts at the same moment
			var wg sync.WaitGroup
			var mu sync.Mutex
			results := map[string]int{}
			for range 20 {
				wg.Go(func() {
					err := pay(l, "acct-bruno", "carla@example.com", "stolen-phone", 10_000)
					mu.Lock()
					results[fmt.Sprint(errors.Is(err, ErrDeviceLimitExceeded), err == nil)]++
					mu.Unlock()
				})
			}
			wg.Wait()
			if results["false true"] != 10 || results["true false"] != 10 {
				t.Errorf("20 concurrent R$ 100,00 from a new device: %v, want 10 passed and 10 refused", results)
			}
		})
	}
}

// TestARevocationAndAnApprovalDoNotDeadlock: a revocation takes the account's row before its
// devices', as an approval (approveDevice) and a removal do. Here an approval's two steps are
// played by hand around a revocation: the approval holds the account's row, the revocation
// starts and waits, and the approval then writes its device's row. Had the revocation deleted
// the devices first, each would wait for the other, and PostgreSQL would abort one (40P01),
// which nothing retries: a support desk's revocation answered 503.
func TestARevocationAndAnApprovalDoNotDeadlock(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	l, err := OpenPostgres(context.Background(), url, 10*time.Second, demo())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	ctx := t.Context()
	if _, err := l.RegisterDevice(ctx, "acct-ana", "phone", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := l.RegisterDevice(ctx, "acct-ana", "laptop", time.Hour); err != nil {
		t.Fatal(err)
	}
	approval, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer approval.Close(context.Background())
	tx, err := approval.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, "SELECT id FROM accounts WHERE id = 'acct-ana' FOR UPDATE"); err != nil { // lockAccount
		t.Fatal(err)
	}
	revoked := make(chan error, 1)
	go func() { _, err := l.RevokeDevices(ctx, "acct-ana"); revoked <- err }()
	// The revocation is under way once a session of the ledger waits on a lock.
	for waiting, deadline := 0, time.Now().Add(10*time.Second); waiting == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the revocation did not start within 10 s")
		}
		if err := approval.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-revoked:
			t.Fatalf("the revocation ended (%v) while the approval held the account's row", err)
		default:
		}
	}
	_, err = tx.Exec(ctx, "UPDATE devices SET pending_until = NULL WHERE account_id = 'acct-ana' AND device_id = 'laptop'")
	if err != nil {
		t.Fatalf("the approval's write of its device: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-revoked; err != nil {
		t.Fatalf("the revocation after the approval: %v, want it made", err)
	}
}

// TestRevokeDevices: on both ledgers, a revocation deletes the account's registrations (its
// devices send under the new-device caps again), is in the table by account and by document,
// moves the version, and reports the one before it.
func TestRevokeDevices(t *testing.T) {
	t.Parallel()
	r := defaultRules(t)
	r.Night.LimitCents, r.DayLimitCents = 0, 0
	start := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	clock := &testClock{now: start}
	for name, l := range rulesBackends(t, r, clock.Now) {
		t.Run(name, func(t *testing.T) {
			clock.Set(start)
			ctx := context.Background()
			for _, d := range []string{"phone", "laptop"} {
				if _, err := l.RegisterDevice(ctx, "acct-ana", d, 0); err != nil {
					t.Fatal(err)
				}
			}
			before, err := l.TierTable(ctx)
			if err != nil {
				t.Fatal(err)
			}
			got, err := l.RevokeDevices(ctx, "acct-ana")
			if want := (Revocation{At: start, Unregistered: 2}); err != nil || got != want {
				t.Fatalf("RevokeDevices = %+v, %v, want %+v", got, err, want)
			}
			var dle *DeviceLimitError
			if err := pay(l, "acct-ana", "bruno@example.com", "phone", 20_001); !errors.As(err, &dle) {
				t.Errorf("R$ 200,01 from the revoked phone: %v, want DeviceLimitError", err)
			}
			table, err := l.TierTable(ctx)
			if err != nil {
				t.Fatal(err)
			}
			ana, err := l.Account(ctx, "acct-ana")
			if err != nil {
				t.Fatal(err)
			}
			if table.Version <= before.Version || !table.RevokedSince("acct-ana").Equal(start) ||
				!table.DeviceRevokedSince(ana.Document, "any-device").Equal(start) || !table.RevokedSince("acct-bruno").IsZero() {
				t.Errorf("table after the revocation: version %d (was %d), %v by account, %v by document",
					table.Version, before.Version, table.RevokedSince("acct-ana"), table.DeviceRevokedSince(ana.Document, "any-device"))
			}
			clock.Advance(time.Hour)
			again, err := l.RevokeDevices(ctx, "acct-ana")
			if want := (Revocation{At: start.Add(time.Hour), Before: start}); err != nil || again != want {
				t.Errorf("a second revocation = %+v, %v, want %+v", again, err, want)
			}
			if _, err := l.RevokeDevices(ctx, "acct-nobody"); !errors.Is(err, ErrAccountNotFound) {
				t.Errorf("revoking an unknown account: %v, want ErrAccountNotFound", err)
			}
		})
	}
}

// TestReadingLimitsTakesNoLock: while another transaction holds Ana's row lock (as a transfer or
// a change of her limits does), reading her limits answers at once: a flood of reads never
// queues behind, nor ahead of, a transfer.
func TestReadingLimitsTakesNoLock(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	l, err := OpenPostgres(context.Background(), url, 2*time.Second, demo())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	holder := pgtest.Connect(t, url)
	tx, err := holder.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(t.Context(), "SELECT id FROM accounts WHERE id = 'acct-ana' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Limits(context.Background(), "acct-ana"); err != nil {
		t.Errorf("reading Ana's limits while her row is locked: %v, want them (the read waited out its 2 s deadline on the lock)", err)
	}
}

// TestACustomersNightLimitHoldsWithTheBanksOff: the bank switches its default night cap off
// (NIGHT_LIMIT_CENTS=0); Bruno sets his own night limit to R$ 1,00. At night a R$ 100,00 PIX to
// Ana is refused by his limit, one of R$ 1,00 goes through; with no limit of his own, Carla's is
// not capped. (The cap used to be skipped whenever the bank's default was 0.)
func TestACustomersNightLimitHoldsWithTheBanksOff(t *testing.T) {
	t.Parallel()
	r := defaultRules(t)
	r.Night.LimitCents, r.DayLimitCents, r.NewDeviceTransferCents, r.NewDeviceDayCents = 0, 0, 0, 0
	clock := &testClock{}
	for name, l := range rulesBackends(t, r, clock.Now) {
		t.Run(name, func(t *testing.T) {
			clock.Set(time.Date(2026, 11, 30, 22, 0, 0, 0, r.Night.Location))
			one := int64(100)
			if _, err := l.SetLimits(context.Background(), "acct-bruno", MoneyLimitsChange{NightLimitCents: &one}); err != nil {
				t.Fatal(err)
			}
			if got, _ := l.Limits(context.Background(), "acct-bruno"); got.NightLimitCents != 100 {
				t.Fatalf("Bruno's night limit shows %d, want 100", got.NightLimitCents)
			}
			if err := pay(l, "acct-bruno", "ana@example.com", "", 10_000); !errors.Is(err, ErrNightLimitExceeded) {
				t.Errorf("R$ 100,00 at night past his own R$ 1,00 limit: %v, want ErrNightLimitExceeded", err)
			}
			if err := pay(l, "acct-bruno", "ana@example.com", "", 100); err != nil {
				t.Errorf("R$ 1,00 at night, within his limit: %v", err)
			}
			if err := pay(l, "acct-carla", "ana@example.com", "", 200_000); err != nil {
				t.Errorf("Carla, no limit of her own, the bank's off: %v, want no cap", err)
			}
		})
	}
}

// TestANewDeviceWaitsOrIsApproved: Ana's first device registers at once; a second (a phisher's,
// with her password) waits a day, capped as a new device meanwhile, and registers by itself when
// the day is over; a third is approved at once by a registered device, while an unregistered one
// may approve nothing and remove only itself; the owner removes a pending device, which is then
// gone from her list and recorded for its tokens to be refused.
func TestANewDeviceWaitsOrIsApproved(t *testing.T) {
	t.Parallel()
	r := defaultRules(t)
	r.DayLimitCents, r.Night.LimitCents = 0, 0
	clock := &testClock{}
	for name, l := range rulesBackends(t, r, clock.Now) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			clock.Set(time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC))
			register := func(device string) DeviceRegistration {
				t.Helper()
				reg, err := l.RegisterDevice(ctx, "acct-ana", device, 24*time.Hour)
				if err != nil {
					t.Fatal(err)
				}
				return reg
			}
			if reg := register("phone"); !reg.Registered {
				t.Fatalf("the account's first device: %+v, want registered at once", reg)
			}
			phisher := register("phisher")
			if phisher.Registered || !phisher.PendingUntil.Equal(clock.Now().Add(24*time.Hour)) {
				t.Fatalf("a second device: %+v, want pending a day", phisher)
			}
			if again := register("phisher"); again != phisher {
				t.Errorf("asking again: %+v, want the same pending registration %+v", again, phisher)
			}
			if err := pay(l, "acct-ana", "bruno@example.com", "phisher", 30_000); !errors.Is(err, ErrDeviceLimitExceeded) {
				t.Errorf("R$ 300,00 from the pending device: %v, want the new-device cap", err)
			}
			if err := l.ApproveDevice(ctx, "acct-ana", "phisher", "phisher"); !errors.Is(err, ErrDeviceNotRegistered) {
				t.Errorf("the pending device approving itself: %v, want ErrDeviceNotRegistered", err)
			}
			register("laptop")
			if err := l.RemoveDevice(ctx, "acct-ana", "phisher", "laptop"); !errors.Is(err, ErrDeviceNotRegistered) {
				t.Errorf("a pending device removing another: %v, want ErrDeviceNotRegistered", err)
			}
			if err := l.ApproveDevice(ctx, "acct-ana", "phone", "laptop"); err != nil {
				t.Errorf("the registered phone approving the laptop: %v", err)
			}
			if err := pay(l, "acct-ana", "bruno@example.com", "laptop", 30_000); err != nil {
				t.Errorf("R$ 300,00 from the approved laptop: %v, want no new-device cap", err)
			}
			if err := l.ApproveDevice(ctx, "acct-ana", "phone", "nobody"); !errors.Is(err, ErrDeviceNotFound) {
				t.Errorf("approving a device that never asked: %v, want ErrDeviceNotFound", err)
			}
			if err := l.RemoveDevice(ctx, "acct-ana", "phone", "phisher"); err != nil {
				t.Fatalf("the owner removing the pending phisher: %v", err)
			}
			list, err := l.Devices(ctx, "acct-ana")
			if err != nil || len(list) != 2 || list[0].DeviceID != "laptop" || list[1].DeviceID != "phone" || !list[0].Registered || !list[1].Registered {
				t.Errorf("Ana's devices after the removal: %+v, %v; want laptop and phone, registered", list, err)
			}
			table, err := l.TierTable(ctx)
			if err != nil || !table.RemovedSince("acct-ana", "phisher").Equal(clock.Now()) {
				t.Errorf("the removal recorded at %v, want %v (%v)", table.RemovedSince("acct-ana", "phisher"), clock.Now(), err)
			}
			// For a login too, which knows the document before the account: its device token is no device.
			if got := table.DeviceRevokedSince("52998224725", "phisher"); !got.Equal(clock.Now()) {
				t.Errorf("the removal, by Ana's document: %v, want %v", got, clock.Now())
			}
			// A pending device registers by itself when its wait is over.
			tablet := register("tablet")
			clock.Advance(24 * time.Hour)
			if err := pay(l, "acct-ana", "bruno@example.com", "tablet", 30_000); err != nil || tablet.Registered {
				t.Errorf("R$ 300,00 from the tablet a day after it asked: %v, want registered by then", err)
			}
			if err := l.RemoveDevice(ctx, "acct-ana", "tablet", "tablet"); err != nil {
				t.Errorf("a device removing itself: %v", err)
			}
		})
	}
}

// TestAPhishedPasswordNeverRegistersAPhone: once an account has had a registered device, no
// registration is at once again, not after the support desk revoked every device nor after the
// owner removed her last one: the phisher's phone waits, sends under the new-device cap, and
// registers at once only when the desk (or a registered device) approves it.
func TestAPhishedPasswordNeverRegistersAPhone(t *testing.T) {
	t.Parallel()
	r := defaultRules(t)
	r.DayLimitCents, r.Night.LimitCents = 0, 0
	clock := &testClock{}
	for name, l := range rulesBackends(t, r, clock.Now) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			clock.Set(time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC))
			register := func(account, device string) DeviceRegistration {
				t.Helper()
				reg, err := l.RegisterDevice(ctx, account, device, 24*time.Hour)
				if err != nil {
					t.Fatal(err)
				}
				return reg
			}
			// Carla: her phone registered, then the desk revokes every device.
			if reg := register("acct-carla", "phone"); !reg.Registered {
				t.Fatalf("Carla's first device ever: %+v, want registered at once", reg)
			}
			if _, err := l.RevokeDevices(ctx, "acct-carla"); err != nil {
				t.Fatal(err)
			}
			if reg := register("acct-carla", "phisher"); reg.Registered {
				t.Fatalf("a device after the desk's revocation: %+v, want pending", reg)
			}
			if err := pay(l, "acct-carla", "bruno@example.com", "phisher", 150_000); !errors.Is(err, ErrDeviceLimitExceeded) {
				t.Errorf("R$ 1.500,00 from the phisher's pending phone: %v, want the new-device cap", err)
			}
			if reg := register("acct-carla", "owner"); reg.Registered {
				t.Errorf("the owner's own new phone: %+v, want pending too (the password proves nothing)", reg)
			}
			if err := l.RemoveDevice(ctx, "acct-carla", "phisher", "owner"); !errors.Is(err, ErrDeviceNotRegistered) {
				t.Errorf("the pending phisher removing the owner's pending phone: %v, want ErrDeviceNotRegistered", err)
			}
			if err := l.ApproveDevice(ctx, "acct-carla", "phisher", "phisher"); !errors.Is(err, ErrDeviceNotRegistered) {
				t.Errorf("a pending device approving itself: %v, want ErrDeviceNotRegistered", err)
			}
			if err := l.DeskApproveDevice(ctx, "acct-carla", "owner"); err != nil {
				t.Fatalf("the desk approving the owner's phone: %v", err)
			}
			if err := pay(l, "acct-carla", "bruno@example.com", "owner", 150_000); err != nil {
				t.Errorf("R$ 1.500,00 from the phone the desk approved: %v, want no new-device cap", err)
			}
			if err := l.DeskApproveDevice(ctx, "acct-carla", "nobody"); !errors.Is(err, ErrDeviceNotFound) {
				t.Errorf("the desk approving a device that never asked: %v, want ErrDeviceNotFound", err)
			}
			// Bruno: his only device removes itself; the next one waits.
			register("acct-bruno", "old")
			if err := l.RemoveDevice(ctx, "acct-bruno", "old", "old"); err != nil {
				t.Fatal(err)
			}
			if reg := register("acct-bruno", "new"); reg.Registered {
				t.Errorf("a device after the account's last was removed: %+v, want pending", reg)
			}
		})
	}
}

// TestTheMigrationRemembersRegisteredDevices: migration 011 backfills, on the strict side, that
// an account has had a registered device from its device rows, its revocations and its removed
// devices; an account with none of them registers its first device at once.
func TestTheMigrationRemembersRegisteredDevices(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	files, _ := fs.Glob(migrations, "migrations/*.sql")
	for _, f := range files { // the schema as it stood before 011
		if strings.HasPrefix(f, "migrations/011") {
			break
		}
		sql, _ := migrations.ReadFile(f)
		if _, err := conn.Exec(ctx, string(sql)); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
	}
	for i, a := range []string{"acct-a", "acct-b", "acct-c", "acct-d"} {
		if _, err := conn.Exec(ctx, "INSERT INTO accounts (id, document, name, password_hash, balance_cents) VALUES ($1, $2, $1, '', 0)", a, fmt.Sprintf("%011d", i)); err != nil {
			t.Fatal(err)
		}
	}
	for _, q := range []string{
		"INSERT INTO devices (account_id, device_id, registered_at, pending_until) VALUES ('acct-a', 'p', now(), now() + interval '1 day')",
		"INSERT INTO device_revocations (account_id, revoked_at) VALUES ('acct-b', now())",
		"INSERT INTO removed_devices (account_id, device_id, removed_at) VALUES ('acct-c', 'x', now())",
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	sql, _ := migrations.ReadFile("migrations/011_device_history.sql")
	if _, err := conn.Exec(ctx, string(sql)); err != nil {
		t.Fatal(err)
	}
	for account, want := range map[string]bool{"acct-a": true, "acct-b": true, "acct-c": true, "acct-d": false} {
		var got bool
		if err := conn.QueryRow(ctx, "SELECT had_registered_device FROM accounts WHERE id = $1", account).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("%s: had_registered_device %v, want %v", account, got, want)
		}
	}
}

// TestATransferIsThreeRoundTrips counts what one transfer sends PostgreSQL, at a gate
// that counts round trips (a Sync or a simple query each), once the connection has prepared its
// statements: the locks, the replay, the payer's settings and what it sent, in one; the money
// moved, in one; COMMIT, in one. A payer whose night starts at another time than the rules'
// pays one more (its sums asked again), and a replay one round trip and its ROLLBACK.
func TestATransferIsThreeRoundTrips(t *testing.T) {
	t.Parallel()
	gate := pgtest.NewGate(t, pgtest.URL(t))
	r := defaultRules(t)
	clock := &testClock{now: time.Date(2026, 11, 30, 21, 0, 0, 0, r.Night.Location)} // a night, begun at the rules' start
	l, err := OpenPostgres(context.Background(), gate.URL+"&pool_max_conns=1", 0, demo(), WithRules(r), WithClock(clock.Now))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	ctx := context.Background()
	pay := func(from, key string) int64 {
		t.Helper()
		before := gate.RoundTrips()
		if _, err := l.Transfer(ctx, TransferRequest{From: from, ToKey: key, AmountCents: 1, IdempotencyKey: newKey(), Device: "phone"}); err != nil {
			t.Fatal(err)
		}
		return gate.RoundTrips() - before
	}
	pay("acct-diego", "ana@example.com") // the connection prepares its statements
	if got, want := pay("acct-diego", "ana@example.com"), int64(3); got != want {
		t.Errorf("a transfer: %d round trips, want %d", got, want)
	}
	later := 22 * time.Hour // a shorter night: in force after the delay
	if _, err := l.SetLimits(ctx, "acct-diego", MoneyLimitsChange{NightStart: &later}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(r.IncreaseDelay + time.Minute) // 21:01 the next day: its night has not begun, the rules' has
	if got, want := pay("acct-diego", "ana@example.com"), int64(4); got != want {
		t.Errorf("a transfer of a payer whose night starts at 22:00: %d round trips, want %d", got, want)
	}
	req := TransferRequest{From: "acct-diego", ToKey: "ana@example.com", AmountCents: 1, IdempotencyKey: newKey()}
	if _, err := l.Transfer(ctx, req); err != nil {
		t.Fatal(err)
	}
	before := gate.RoundTrips()
	if rec, err := l.Transfer(ctx, req); err != nil || !rec.Replayed {
		t.Fatalf("a replay: %+v, %v", rec, err)
	}
	if got, want := gate.RoundTrips()-before, int64(2); got != want {
		t.Errorf("a replay: %d round trips, want %d", got, want)
	}
}

// TestTheLedgersClockStampsEverything: two replicas whose own clocks are an hour apart stamp a
// payer's transfers in the order the locks put them, at the database's time, and date a raise
// and a device's wait from it too: a replica behind would otherwise stamp a PIX before 20:00 that
// the other had stamped after, and send it past the night cap.
func TestTheLedgersClockStampsEverything(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	ctx := context.Background()
	open := func(skew time.Duration) *PostgresLedger {
		l, err := OpenPostgres(ctx, url, 10*time.Second, demo(), WithRules(Rules{DayLimitCents: 1_000_000, IncreaseDelay: 24 * time.Hour}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(l.Close)
		l.now = func() time.Time { return time.Now().Add(skew) }
		return l
	}
	ahead, behind := open(time.Hour), open(-time.Hour)
	before, err := ahead.Now(ctx) // the database's clock
	if err != nil {
		t.Fatal(err)
	}
	var stamps []time.Time
	for _, l := range []*PostgresLedger{ahead, behind, ahead} {
		r, err := l.Transfer(ctx, TransferRequest{From: "acct-ana", ToKey: "bruno@example.com", AmountCents: 100, IdempotencyKey: newKey()})
		if err != nil {
			t.Fatal(err)
		}
		stamps = append(stamps, r.CreatedAt)
	}
	day := int64(2_000_000)
	raised, err := behind.SetLimits(ctx, "acct-ana", MoneyLimitsChange{DayLimitCents: &day})
	if err != nil {
		t.Fatal(err)
	}
	read, err := ahead.Limits(ctx, "acct-ana")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := behind.RegisterDevice(ctx, "acct-ana", "first", time.Hour); err != nil {
		t.Fatal(err)
	}
	second, err := behind.RegisterDevice(ctx, "acct-ana", "second", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	after, err := ahead.Now(ctx)
	if err != nil {
		t.Fatal(err)
	}
	within := func(at, from, to time.Time) bool { return !at.Before(from) && !at.After(to) }
	for i, at := range stamps {
		if !within(at, before, after) || i > 0 && at.Before(stamps[i-1]) {
			t.Errorf("transfers stamped %v, want each in order within the database's %v to %v", stamps, before, after)
			break
		}
	}
	if len(raised.Pending) != 1 || !within(raised.Pending[0].EffectiveAt, before.Add(24*time.Hour), after.Add(24*time.Hour)) {
		t.Errorf("a raise asked on the replica behind: %+v, want it to apply 24 h after the database's %v to %v", raised.Pending, before, after)
	} else if len(read.Pending) != 1 || !read.Pending[0].EffectiveAt.Equal(raised.Pending[0].EffectiveAt) {
		t.Errorf("the raise read back: %+v, want the time its change answered, %v", read.Pending, raised.Pending[0].EffectiveAt)
	}
	if until := second.PendingUntil; !within(until, before.Add(time.Hour), after.Add(time.Hour)) {
		t.Errorf("a second device registered on the replica behind waits until %v, want an hour after the database's %v to %v", until, before, after)
	}
}

// TestBothLedgersReadBackWhatTheyAnswer: a raise's time as its change answers it is the one a read
// gives back, to the microsecond the database keeps (a clock counting nanoseconds answered
// 15:00:00.123456789 and read back .123456: applied before the time promised), and a receipt's
// time is in microseconds in both ledgers.
func TestBothLedgersReadBackWhatTheyAnswer(t *testing.T) {
	t.Parallel()
	sp, err := time.LoadLocation("America/Sao_Paulo")
	if err != nil {
		t.Fatal(err)
	}
	clock := &testClock{now: time.Date(2026, 11, 30, 12, 0, 0, 123456789, sp)}
	for name, l := range rulesBackends(t, defaultRules(t), clock.Now) {
		t.Run(name, func(t *testing.T) {
			night := int64(500_000)
			set, err := l.SetLimits(context.Background(), "acct-ana", MoneyLimitsChange{NightLimitCents: &night})
			if err != nil {
				t.Fatal(err)
			}
			got, err := l.Limits(context.Background(), "acct-ana")
			if err != nil {
				t.Fatal(err)
			}
			if len(set.Pending) != 1 || len(got.Pending) != 1 || !set.Pending[0].EffectiveAt.Equal(got.Pending[0].EffectiveAt) {
				t.Errorf("the change answered %+v, a read gives %+v", set.Pending, got.Pending)
			}
			r, err := l.Transfer(context.Background(), TransferRequest{From: "acct-ana", ToKey: "bruno@example.com", AmountCents: 100, IdempotencyKey: newKey(), Device: "phone"})
			if err != nil {
				t.Fatal(err)
			}
			if r.CreatedAt.Nanosecond()%1000 != 0 {
				t.Errorf("a receipt stamped %v, want microseconds", r.CreatedAt)
			}
		})
	}
}

// TestRemovingADeviceOfNoAccount: both ledgers answer a removal on an account they do not know as
// every call answers a token whose account is gone.
func TestRemovingADeviceOfNoAccount(t *testing.T) {
	t.Parallel()
	for name, l := range rulesBackends(t, defaultRules(t), time.Now) {
		for _, actor := range []string{"d1", "d2"} {
			if err := l.RemoveDevice(context.Background(), "acct-nobody", actor, "d1"); !errors.Is(err, ErrAccountNotFound) {
				t.Errorf("%s, by %s: %v, want ErrAccountNotFound", name, actor, err)
			}
		}
	}
}

// TestALostCommitOfAChangeMayHaveMadeIt: a change of limits whose COMMIT is sent and never
// answered is ErrChangeOutcomeUnknown, never "nothing was changed" (ErrUnavailable): here the
// COMMIT reaches the server after its client gave up, and the change is made.
func TestALostCommitOfAChangeMayHaveMadeIt(t *testing.T) {
	t.Parallel()
	l, gate := gatedLedger(t, time.Second)
	ctx := context.Background()
	if _, err := l.Limits(ctx, "acct-ana"); err != nil { // a connection dialled: the budget is the statements', not a dial's
		t.Fatal(err)
	}
	lower := int64(50_000) // a lower night limit applies at once
	gate.HoldCommits()
	_, err := l.SetLimits(ctx, "acct-ana", MoneyLimitsChange{NightLimitCents: &lower})
	if !errors.Is(err, ErrChangeOutcomeUnknown) || errors.Is(err, ErrUnavailable) {
		t.Fatalf("a change whose COMMIT is held: %v, want ErrChangeOutcomeUnknown", err)
	}
	gate.ReleaseCommits()
	for start := time.Now(); ; {
		got, err := l.Limits(ctx, "acct-ana")
		if err == nil && got.NightLimitCents == lower {
			break
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("the limits once the COMMIT arrived: %+v, %v; want the night limit %d: the change was made", got, err, lower)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestAChangeIsTimedOnceItHoldsTheLock: a raise that waited for its account's row lock (held by
// a transaction that changed nothing) is dated by the ledger's clock after the wait, not before
// it: its effective time is 24 h after the holder let go, never earlier.
func TestAChangeIsTimedOnceItHoldsTheLock(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	ctx := context.Background()
	l, err := OpenPostgres(ctx, url, 10*time.Second, demo(), WithRules(Rules{DayLimitCents: 1_000_000, IncreaseDelay: 24 * time.Hour}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	holder, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(ctx)
	tx, err := holder.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT 1 FROM accounts WHERE id = 'acct-ana' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	raised := make(chan MoneyLimits, 1)
	go func() {
		day := int64(2_000_000)
		m, err := l.SetLimits(ctx, "acct-ana", MoneyLimitsChange{DayLimitCents: &day})
		if err != nil {
			t.Error(err)
		}
		raised <- m
	}()
	for waiting := false; !waiting; { // the raise waits for the lock (asked on a connection of its own: a transaction's statistics stand still)
		if err := l.pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database())").Scan(&waiting); err != nil {
			t.Fatal(err)
		}
	}
	var released time.Time
	if err := tx.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&released); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	m := <-raised
	if len(m.Pending) != 1 || m.Pending[0].EffectiveAt.Before(released.Add(24*time.Hour)) {
		t.Errorf("a raise that waited for the lock until %v: %+v, want it effective 24 h after that or later", released, m.Pending)
	}
}
