package pix

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
)

// Tier is a named set of route limits an account is held to: requests per window of PIX and of
// the statement, and the capacity of the payer's look-up buckets. A zero figure is the
// deployment's default (its PIX_LIMIT, STATEMENT_LIMIT, and LOOKUP_CAPACITY or
// LOOKUP_CAPACITY_PJ by the holder's person), so a tier says only what it changes.
type Tier struct {
	Name                                     string
	PIXLimit, StatementLimit, LookupCapacity int
	// PIXQueue, when above 0, puts the PIX on a queue of that many places (leaky_bucket),
	// paced at the tier's PIX limit: a payroll goes through at a steady pace.
	PIXQueue int
}

// The tiers every ledger starts with. Every account is on its person's tier (pf, pj) unless
// support moves it (Ledger.SetTier).
var DefaultTiers = []Tier{
	{Name: "pf"},
	{Name: "pj"},
	{Name: "premium", PIXLimit: 30, StatementLimit: 120},
	{Name: "restricted", PIXLimit: 5, StatementLimit: 10, LookupCapacity: 20},
	{Name: "payroll", PIXLimit: 60, PIXQueue: 30},
}

// TierOf is an account's tier and its own overrides (zero: none), which win over the tier's.
type TierOf struct {
	Tier                                     string
	PIXLimit, StatementLimit, LookupCapacity int
}

// TierTable is what every replica keeps in memory to decide an account's limits without asking
// the ledger on each request: the tiers, the accounts that are not on their person's tier or
// carry overrides, when support last revoked an account's devices, and the version of all
// three, which moves on every change.
type TierTable struct {
	Version  int64
	Tiers    map[string]Tier
	Accounts map[string]TierOf
	// Revoked is when support last revoked each account's trusted devices (RevokeDevices), by
	// account id; RevokedDocuments the same by its holder's document (the latest of the
	// holder's accounts), for a login, which knows the document before the account.
	Revoked, RevokedDocuments map[string]time.Time
	// RemovedDevices is when the owner last removed each device (RemoveDevice), by account and
	// device (RemovedSince); RemovedByDocument the same by its holder's document and device, for
	// a login (DeviceRevokedSince).
	RemovedDevices, RemovedByDocument map[string]time.Time
}

// RevokedSince is when account's devices were last revoked; zero if never. A token issued
// before it is not honoured.
func (t TierTable) RevokedSince(account string) time.Time { return t.Revoked[account] }

// DeviceRevokedSince is when a login's device of document's holder stopped being trusted: the
// later of support's last revocation of the devices of one of document's accounts and the
// owner's last removal of that device. A device token issued before it is no device.
func (t TierTable) DeviceRevokedSince(document, device string) time.Time {
	revoked, removed := t.RevokedDocuments[document], t.RemovedByDocument[removedKey(document, device)]
	if removed.After(revoked) {
		return removed
	}
	return revoked
}

// Of is account's tier and overrides: its own, or its person's tier.
func (t TierTable) Of(account string, person Person) TierOf {
	if a, ok := t.Accounts[account]; ok {
		return a
	}
	if person == PJ {
		return TierOf{Tier: "pj"}
	}
	return TierOf{Tier: "pf"}
}

// Figures are account's tier with its overrides in place (a figure of its own wins over its
// tier's; a zero limit or capacity: the default, a zero PIXQueue: none), read in one look-up.
func (t TierTable) Figures(account string, person Person) Tier {
	a := t.Of(account, person)
	tier := t.Tiers[a.Tier]
	tier.PIXLimit = cmp.Or(a.PIXLimit, tier.PIXLimit)
	tier.StatementLimit = cmp.Or(a.StatementLimit, tier.StatementLimit)
	tier.LookupCapacity = cmp.Or(a.LookupCapacity, tier.LookupCapacity)
	return tier
}

// SortedTiers lists the table's tiers by name.
func (t TierTable) SortedTiers() []Tier {
	out := make([]Tier, 0, len(t.Tiers))
	for _, tier := range t.Tiers {
		out = append(out, tier)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// ErrUnknownTier means a tier that does not exist was named.
var ErrUnknownTier = errors.New("no such tier")

// MaxTierLimit bounds every figure of a tier or an override.
const MaxTierLimit = 1_000_000

// valid checks an assignment's figures.
func (a TierOf) valid() error {
	for _, v := range []int{a.PIXLimit, a.StatementLimit, a.LookupCapacity} {
		if v < 0 || v > MaxTierLimit {
			return fmt.Errorf("%w: overrides must be from 0 (none) to %d", ErrInvalidLimits, MaxTierLimit)
		}
	}
	return nil
}

// tierStore is the memory ledger's tier table.
type tierStore struct{ table TierTable }

func newTierStore() tierStore {
	t := TierTable{Version: 1, Tiers: map[string]Tier{}, Accounts: map[string]TierOf{},
		Revoked: map[string]time.Time{}, RevokedDocuments: map[string]time.Time{}, RemovedDevices: map[string]time.Time{},
		RemovedByDocument: map[string]time.Time{}}
	for _, tier := range DefaultTiers {
		t.Tiers[tier.Name] = tier
	}
	return tierStore{t}
}

// TierTable implements Ledger.
func (l *MemoryLedger) TierTable(context.Context) (TierTable, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	t := l.tiers.table
	t.Tiers, t.Accounts = maps.Clone(t.Tiers), maps.Clone(t.Accounts)
	t.Revoked, t.RevokedDocuments = maps.Clone(t.Revoked), maps.Clone(t.RevokedDocuments)
	t.RemovedDevices, t.RemovedByDocument = maps.Clone(t.RemovedDevices), maps.Clone(t.RemovedByDocument)
	return t, nil
}

// RevokeDevices implements Ledger.
func (l *MemoryLedger) RevokeDevices(_ context.Context, accountID string) (Revocation, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	a, ok := l.accounts[accountID]
	if !ok {
		return Revocation{}, ErrAccountNotFound
	}
	r := Revocation{At: l.clock(), Unregistered: len(a.devices), Before: l.tiers.table.Revoked[accountID]}
	clear(a.devices)
	a.hadDevice = true // strict, as the migration's backfill: a revoked account registers no device at once
	l.tiers.table.Revoked[accountID] = r.At
	l.tiers.table.RevokedDocuments[a.Document] = r.At
	l.tiers.table.Version++
	return r, nil
}

// TierVersion implements Ledger.
func (l *MemoryLedger) TierVersion(context.Context) (int64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.tiers.table.Version, nil
}

// Revocation is what RevokeDevices did: when, how many devices registered for PIX it deleted,
// and the account's previous revocation (zero: none), for the audit's before and after.
type Revocation struct {
	At, Before   time.Time
	Unregistered int
}

// SetTier implements Ledger.
func (l *MemoryLedger) SetTier(_ context.Context, accountID string, a TierOf) error {
	if err := a.valid(); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.accounts[accountID]; !ok {
		return ErrAccountNotFound
	}
	if _, ok := l.tiers.table.Tiers[a.Tier]; !ok {
		return ErrUnknownTier
	}
	l.tiers.table.Accounts[accountID] = a
	l.tiers.table.Version++
	return nil
}

// TierTable implements Ledger: the whole table, in one snapshot.
func (l *PostgresLedger) TierTable(ctx context.Context) (TierTable, error) {
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	t := TierTable{Tiers: map[string]Tier{}, Accounts: map[string]TierOf{}, Revoked: map[string]time.Time{}, RevokedDocuments: map[string]time.Time{},
		RemovedDevices: map[string]time.Time{}, RemovedByDocument: map[string]time.Time{}}
	err := pgx.BeginTxFunc(ctx, l.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, "SELECT version FROM tier_version").Scan(&t.Version); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, "SELECT name, pix_limit, statement_limit, lookup_capacity, pix_queue FROM tiers")
		if err != nil {
			return err
		}
		tiers, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Tier, error) {
			var x Tier
			return x, row.Scan(&x.Name, &x.PIXLimit, &x.StatementLimit, &x.LookupCapacity, &x.PIXQueue)
		})
		if err != nil {
			return err
		}
		for _, x := range tiers {
			t.Tiers[x.Name] = x
		}
		rows, err = tx.Query(ctx, "SELECT account_id, tier, pix_limit, statement_limit, lookup_capacity FROM account_tiers")
		if err != nil {
			return err
		}
		_, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (struct{}, error) {
			var id string
			var a TierOf
			err := row.Scan(&id, &a.Tier, &a.PIXLimit, &a.StatementLimit, &a.LookupCapacity)
			t.Accounts[id] = a
			return struct{}{}, err
		})
		if err != nil {
			return err
		}
		return l.readDeviceChanges(ctx, tx, &t)
	})
	if err != nil {
		return TierTable{}, fmt.Errorf("pix: tiers: %w", unavailable(err))
	}
	return t, nil
}

// readDeviceChanges reads into t, in TierTable's snapshot, the accounts' revocations and the
// removals of devices that can still refuse a token.
func (l *PostgresLedger) readDeviceChanges(ctx context.Context, tx pgx.Tx, t *TierTable) error {
	rows, err := tx.Query(ctx, `SELECT r.account_id, a.document, r.revoked_at
		FROM device_revocations r JOIN accounts a ON a.id = r.account_id`)
	if err != nil {
		return err
	}
	_, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (struct{}, error) {
		var id, document string
		var at time.Time
		err := row.Scan(&id, &document, &at)
		t.Revoked[id] = at
		if at.After(t.RevokedDocuments[document]) {
			t.RevokedDocuments[document] = at
		}
		return struct{}{}, err
	})
	if err != nil {
		return err
	}
	since, err := l.removalsSince(ctx, tx)
	if err != nil {
		return err
	}
	rows, err = tx.Query(ctx, `SELECT r.account_id, a.document, r.device_id, r.removed_at
		FROM removed_devices r JOIN accounts a ON a.id = r.account_id WHERE r.removed_at > $1`, since)
	if err != nil {
		return err
	}
	_, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (struct{}, error) {
		var id, document, device string
		var at time.Time
		err := row.Scan(&id, &document, &device, &at)
		t.RemovedDevices[removedKey(id, device)] = at.UTC()
		if at.After(t.RemovedByDocument[removedKey(document, device)]) {
			t.RemovedByDocument[removedKey(document, device)] = at.UTC()
		}
		return struct{}{}, err
	})
	return err
}

// moveTierVersion moves the tier table's version on a change. Not by one: a database that
// failed over to a standby which missed the last change, or was restored from a backup, would
// give the next change a version a replica has already seen, with another table, and the
// replica would never reload it (a revocation unseen). The version is the change's time in µs
// instead, past any version before it, which no other history reaches
// (TestATierChangeAfterAFailoverIsSeen).
const moveTierVersion = "UPDATE tier_version SET version = greatest(version + 1, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint)"

// removalsSince is the time before which a device's removal refuses no token still alive (the
// zero time: every removal counts).
func (l *PostgresLedger) removalsSince(ctx context.Context, tx pgx.Tx) (time.Time, error) {
	if l.tokensLive == 0 {
		return time.Time{}, nil
	}
	now, err := l.clock(ctx, tx)
	return now.Add(-l.tokensLive), err
}

// TierVersion implements Ledger.
func (l *PostgresLedger) TierVersion(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	var v int64
	if err := l.pool.QueryRow(ctx, "SELECT version FROM tier_version").Scan(&v); err != nil {
		return 0, fmt.Errorf("pix: tier version: %w", unavailable(err))
	}
	return v, nil
}

// SetTier implements Ledger: the account's tier and overrides, and the version moved, in one
// transaction.
func (l *PostgresLedger) SetTier(ctx context.Context, accountID string, a TierOf) error {
	if err := a.valid(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	err := l.change(ctx, func(tx pgx.Tx) error {
		var exists, known bool
		if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM accounts WHERE id = $1), EXISTS (SELECT 1 FROM tiers WHERE name = $2)",
			accountID, a.Tier).Scan(&exists, &known); err != nil {
			return err
		}
		switch {
		case !exists:
			return ErrAccountNotFound
		case !known:
			return ErrUnknownTier
		}
		if _, err := tx.Exec(ctx, `INSERT INTO account_tiers (account_id, tier, pix_limit, statement_limit, lookup_capacity)
			VALUES ($1, $2, $3, $4, $5) ON CONFLICT (account_id) DO UPDATE
			SET tier = $2, pix_limit = $3, statement_limit = $4, lookup_capacity = $5`,
			accountID, a.Tier, a.PIXLimit, a.StatementLimit, a.LookupCapacity); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, moveTierVersion)
		return err
	})
	if err != nil {
		return fmt.Errorf("pix: set tier: %w", unavailable(err))
	}
	return nil
}

// RevokeDevices implements Ledger: in one transaction, the account's devices registered for PIX
// deleted, its revocation recorded, and the table's version moved.
func (l *PostgresLedger) RevokeDevices(ctx context.Context, accountID string) (Revocation, error) {
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	var r Revocation
	err := l.change(ctx, func(tx pgx.Tx) error {
		// The account's row first, as every change of its devices locks it (lockAccount): one
		// order of locks, account then devices, so a revocation and the owner's approval or
		// removal of a device wait for each other instead of deadlocking.
		if err := lockAccount(ctx, tx, accountID); err != nil {
			return err
		}
		var before *time.Time
		if err := tx.QueryRow(ctx, `SELECT (SELECT revoked_at FROM device_revocations WHERE account_id = $1)`, accountID).Scan(&before); err != nil {
			return err
		}
		if before != nil {
			r.Before = before.UTC()
		}
		tag, err := tx.Exec(ctx, "DELETE FROM devices WHERE account_id = $1", accountID)
		if err != nil {
			return err
		}
		r.Unregistered = int(tag.RowsAffected())
		// Strict, as the migration's backfill: a revoked account registers no device at once.
		if _, err := tx.Exec(ctx, "UPDATE accounts SET had_registered_device = true WHERE id = $1", accountID); err != nil {
			return err
		}
		// The clock the logins' tokens are stamped with, read last before the COMMIT: a token
		// issued while the revocation was on its way is refused with those before it.
		if r.At, err = l.clock(ctx, tx); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO device_revocations (account_id, revoked_at) VALUES ($1, $2)
			ON CONFLICT (account_id) DO UPDATE SET revoked_at = $2`, accountID, r.At); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, moveTierVersion)
		return err
	})
	if err != nil {
		if errors.Is(err, ErrAccountNotFound) {
			return Revocation{}, err
		}
		return Revocation{}, fmt.Errorf("pix: revoke devices: %w", unavailable(err))
	}
	return r, nil
}
