package pix

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sort"

	"github.com/jackc/pgx/v5"
)

// Tier is a named set of route limits an account is held to: requests per window of PIX and of
// the statement, and the capacity of the payer's look-up buckets. A zero figure is the
// deployment's default (its PIX_LIMIT, STATEMENT_LIMIT, and LOOKUP_CAPACITY or
// LOOKUP_CAPACITY_PJ by the holder's person), so a tier says only what it changes.
type Tier struct {
	Name                                     string
	PIXLimit, StatementLimit, LookupCapacity int
}

// The tiers every ledger starts with. Every account is on its person's tier (pf, pj) unless
// support moves it (Ledger.SetTier).
var DefaultTiers = []Tier{
	{Name: "pf"},
	{Name: "pj"},
	{Name: "premium", PIXLimit: 30, StatementLimit: 120},
	{Name: "restricted", PIXLimit: 5, StatementLimit: 10, LookupCapacity: 20},
}

// TierOf is an account's tier and its own overrides (zero: none), which win over the tier's.
type TierOf struct {
	Tier                                     string
	PIXLimit, StatementLimit, LookupCapacity int
}

// TierTable is what every replica keeps in memory to decide an account's limits without asking
// the ledger on each request: the tiers, the accounts that are not on their person's tier or
// carry overrides, and the version of both, which moves on every change.
type TierTable struct {
	Version  int64
	Tiers    map[string]Tier
	Accounts map[string]TierOf
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

// Limits are account's figures: its overrides, else its tier's; zero: the default.
func (t TierTable) Limits(account string, person Person) (pixLimit, statementLimit, lookupCapacity int) {
	a := t.Of(account, person)
	tier := t.Tiers[a.Tier]
	pick := func(own, tiers int) int {
		if own > 0 {
			return own
		}
		return tiers
	}
	return pick(a.PIXLimit, tier.PIXLimit), pick(a.StatementLimit, tier.StatementLimit), pick(a.LookupCapacity, tier.LookupCapacity)
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
	t := TierTable{Version: 1, Tiers: map[string]Tier{}, Accounts: map[string]TierOf{}}
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
	return t, nil
}

// TierVersion implements Ledger.
func (l *MemoryLedger) TierVersion(context.Context) (int64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.tiers.table.Version, nil
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
	t := TierTable{Tiers: map[string]Tier{}, Accounts: map[string]TierOf{}}
	err := pgx.BeginTxFunc(ctx, l.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, "SELECT version FROM tier_version").Scan(&t.Version); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, "SELECT name, pix_limit, statement_limit, lookup_capacity FROM tiers")
		if err != nil {
			return err
		}
		tiers, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Tier, error) {
			var x Tier
			return x, row.Scan(&x.Name, &x.PIXLimit, &x.StatementLimit, &x.LookupCapacity)
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
		return err
	})
	if err != nil {
		return TierTable{}, fmt.Errorf("pix: tiers: %w", unavailable(err))
	}
	return t, nil
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
	err := pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
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
		_, err := tx.Exec(ctx, "UPDATE tier_version SET version = version + 1")
		return err
	})
	if err != nil {
		return fmt.Errorf("pix: set tier: %w", unavailable(err))
	}
	return nil
}
