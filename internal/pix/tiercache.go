package pix

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Tiers is a replica's copy of the ledger's tier table (TierTable): which limits each
// account is held to, read on every request from memory, never from the ledger. It polls the
// table's version every interval and reloads the table when it moved, so a change made on any
// replica (the support desk's PUT) is in force everywhere within about an interval plus a query.
// Polling a one-row version, rather than LISTEN/NOTIFY, needs no connection held open per
// replica and survives a database restart or failover without re-subscribing; its price is one
// indexed read per interval per replica. A replica that cannot read the table keeps the last one
// it knew, logging it once, and never falls back to no limits: the defaults are the
// deployment's own figures, the floor under every tier.
type Tiers struct {
	ledger TierStore
	logger *slog.Logger
	table  atomic.Pointer[TierTable]
	// forget, once set (OnChange), is told each account whose assignment a reload changed.
	forget atomic.Pointer[func(account string)]

	read    atomic.Int64 // when the table was last read, or its version found unchanged (Unix ns; 0: never)
	failing bool         // the last poll failed (the poller's own)
	stop    chan struct{}
	done    sync.WaitGroup
}

// NewTiers loads the table (an empty one, all defaults, if the ledger cannot answer now; the
// poller retries) and polls its version every interval until Close.
func NewTiers(ctx context.Context, ledger TierStore, logger *slog.Logger, every time.Duration) *Tiers {
	t := &Tiers{ledger: ledger, logger: logger, stop: make(chan struct{})}
	t.table.Store(&TierTable{})
	if err := t.Refresh(ctx); err != nil {
		t.failing = true
		logger.Warn("cannot read the tier table: every account has the default limits until it can", "err", err)
	}
	t.done.Add(1)
	go t.poll(every)
	return t
}

// Refresh reloads the table now.
func (t *Tiers) Refresh(ctx context.Context) error {
	table, err := t.ledger.TierTable(ctx)
	if err != nil {
		return err
	}
	t.read.Store(time.Now().UnixNano())
	// Two refreshes may overlap (the poller's and a handler's): the older table never replaces
	// a newer one.
	var old *TierTable
	for {
		old = t.table.Load()
		if old != nil && old.Version > table.Version {
			return nil
		}
		if t.table.CompareAndSwap(old, &table) {
			break
		}
	}
	if old == nil {
		return nil
	}
	if forget := t.forget.Load(); forget != nil {
		for id := range changed(old.Accounts, table.Accounts) {
			(*forget)(id)
		}
	}
	return nil
}

// OnChange has forget told each account whose tier or figures a later reload changes, once the
// new table is in force: the server drops the account's keys from its deny cache, which would
// otherwise refuse it from its memory of a key full under the old limit (a raised tier's
// customer, told Retry-After 59 while 20 remain).
func (t *Tiers) OnChange(forget func(account string)) { t.forget.Store(&forget) }

// changed are the accounts whose assignment differs between two tables.
func changed(old, new map[string]TierOf) map[string]bool {
	out := map[string]bool{}
	for id, a := range new {
		if b, ok := old[id]; !ok || b != a {
			out[id] = true
		}
	}
	for id := range old {
		if _, ok := new[id]; !ok {
			out[id] = true
		}
	}
	return out
}

// ErrStale is Fresh's answer when the table was not read lately.
var ErrStale = errors.New("pix: the tier table, revocations included, was not read lately")

// Fresh is nil when this replica read the table (or found it unchanged) within the last within,
// else ErrStale: a replica that cannot read it keeps its last limits, and its last revocations
// too, so that a device revoked since still gets in on it; /readyz says so (app's probes).
func (t *Tiers) Fresh(within time.Duration) error {
	if read := t.read.Load(); read == 0 || time.Since(time.Unix(0, read)) > within {
		return ErrStale
	}
	return nil
}

// Table is the table in force on this replica.
func (t *Tiers) Table() TierTable { return *t.table.Load() }

func (t *Tiers) poll(every time.Duration) {
	defer t.done.Done()
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-t.stop:
			return
		case <-tick.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), every)
		v, err := t.ledger.TierVersion(ctx)
		cancel()
		switch {
		case err == nil && v != t.table.Load().Version:
			// The reload within the ledger's own deadline (DB_TIMEOUT), not the interval's: a
			// table that takes longer to read than an interval is read late, not never.
			err = t.Refresh(context.Background())
		case err == nil:
			t.read.Store(time.Now().UnixNano()) // unchanged: what this replica holds is the table
		}
		switch {
		case err != nil && !t.failing:
			t.failing = true
			t.logger.Warn("cannot read the tier table: keeping the last limits known", "version", t.table.Load().Version, "err", err)
		case err == nil && t.failing:
			t.failing = false
			t.logger.Info("tier table read again", "version", t.table.Load().Version)
		}
	}
}

// Close stops the poller.
func (t *Tiers) Close() {
	close(t.stop)
	t.done.Wait()
}

// RevokedSince is when support last revoked account's devices (auth.Revocations).
func (t *Tiers) RevokedSince(account string) time.Time { return t.table.Load().RevokedSince(account) }

// RemovedSince is when account's owner last removed device (auth.Revocations).
func (t *Tiers) RemovedSince(account, device string) time.Time {
	return t.table.Load().RemovedSince(account, device)
}
