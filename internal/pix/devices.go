package pix

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// The errors of the device registration calls.
var (
	// ErrDeviceNotRegistered: the device acting is not registered for PIX, and may not do this.
	ErrDeviceNotRegistered = errors.New("device not registered")
	// ErrDeviceNotFound: the device named is neither registered nor pending.
	ErrDeviceNotFound = errors.New("device not found")
)

// DeviceRegistration is a device of an account as its registration stands: registered for PIX,
// or pending until PendingUntil (when it registers by itself).
type DeviceRegistration struct {
	DeviceID     string
	Registered   bool
	PendingUntil time.Time // zero once registered
}

// registration is a device's row at now: registered when approved, or when its wait is over.
// Its time is to the microsecond, as PostgreSQL keeps it: the registration's answer and a later
// list say the same instant.
func registration(device string, pendingUntil time.Time, now time.Time) DeviceRegistration {
	if !pendingUntil.IsZero() && now.Before(pendingUntil) {
		return DeviceRegistration{DeviceID: device, PendingUntil: pendingUntil.UTC().Truncate(time.Microsecond)}
	}
	return DeviceRegistration{DeviceID: device, Registered: true}
}

// removedKey names a device in TierTable.RemovedDevices (by account) and RemovedByDocument.
func removedKey(account, device string) string { return account + "/" + device }

// RemovedSince is when the account's owner removed device (RemoveDevice); zero if never: its
// access tokens issued before then are refused.
func (t TierTable) RemovedSince(account, device string) time.Time {
	return t.RemovedDevices[removedKey(account, device)]
}

// memory ledger: a.devices holds each device's pending_until (zero: registered).

// registered reports whether device is registered for PIX at now.
func (a *memAccount) registered(device string, now time.Time) bool {
	until, ok := a.devices[device]
	return ok && device != "" && registration(device, until, now).Registered
}

// RegisterDevice implements Ledger.
func (l *MemoryLedger) RegisterDevice(_ context.Context, accountID, device string, delay time.Duration) (DeviceRegistration, error) {
	if device == "" {
		return DeviceRegistration{}, errors.New("pix: a device needs an id")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	a, ok := l.accounts[accountID]
	if !ok {
		return DeviceRegistration{}, ErrAccountNotFound
	}
	now := l.clock()
	if until, ok := a.devices[device]; ok {
		return registration(device, until, now), nil
	}
	until := time.Time{}
	if delay > 0 && a.hadDevice {
		until = now.Add(delay)
	}
	a.devices[device], a.hadDevice = until, true
	return registration(device, until, now), nil
}

// Devices implements Ledger.
func (l *MemoryLedger) Devices(_ context.Context, accountID string) ([]DeviceRegistration, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	a, ok := l.accounts[accountID]
	if !ok {
		return nil, ErrAccountNotFound
	}
	now := l.clock()
	out := []DeviceRegistration{}
	for _, d := range mapKeys(a.devices) {
		out = append(out, registration(d, a.devices[d], now))
	}
	return out, nil
}

// ApproveDevice implements Ledger.
func (l *MemoryLedger) ApproveDevice(_ context.Context, accountID, approver, device string) error {
	return l.onDevice(accountID, approver, device, false, func(a *memAccount, _ time.Time) { a.devices[device] = time.Time{} })
}

// DeskApproveDevice implements Ledger.
func (l *MemoryLedger) DeskApproveDevice(_ context.Context, accountID, device string) error {
	return l.onDevice(accountID, deskActor, device, false, func(a *memAccount, _ time.Time) { a.devices[device] = time.Time{} })
}

// deskActor stands for the support desk in onDevice: never a device id (those are random
// text), so no token can name it.
const deskActor = "\x00desk"

// RemoveDevice implements Ledger.
func (l *MemoryLedger) RemoveDevice(_ context.Context, accountID, actor, device string) error {
	return l.onDevice(accountID, actor, device, true, func(a *memAccount, now time.Time) {
		delete(a.devices, device)
		at := now.UTC().Truncate(time.Microsecond) // the ledger's clock counts µs (MemoryLedger.Now)
		l.tiers.table.RemovedDevices[removedKey(accountID, device)] = at
		l.tiers.table.RemovedByDocument[removedKey(a.Document, device)] = at
		l.tiers.table.Version++
	})
}

// onDevice does to device, under the ledger's lock, what actor asks: only a registered actor
// may (or, with self, the device itself), and only to a device pending or registered.
func (l *MemoryLedger) onDevice(accountID, actor, device string, self bool, do func(a *memAccount, now time.Time)) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	a, ok := l.accounts[accountID]
	if !ok {
		return ErrAccountNotFound
	}
	now := l.clock()
	if actor != deskActor && !(self && actor == device) && !a.registered(actor, now) {
		return ErrDeviceNotRegistered
	}
	if _, ok := a.devices[device]; !ok {
		return ErrDeviceNotFound
	}
	do(a, now)
	return nil
}

// mapKeys are m's keys, sorted: a listing reads the same on every call.
func mapKeys(m map[string]time.Time) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// RegisterDevice implements Ledger: under the account's row lock, so that two devices asking at
// once cannot both find the account without a registered device and both register at once.
func (l *PostgresLedger) RegisterDevice(ctx context.Context, accountID, device string, delay time.Duration) (DeviceRegistration, error) {
	if device == "" {
		return DeviceRegistration{}, errors.New("pix: a device needs an id")
	}
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	var out DeviceRegistration
	err := l.change(ctx, func(tx pgx.Tx) error {
		var had bool
		var now time.Time
		err := tx.QueryRow(ctx, lockedAtSQL, accountID, l.at()).Scan(&had, &now) // the ledger's clock once the lock is held
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrAccountNotFound
		} else if err != nil {
			return err
		}
		now = now.UTC()
		var until *time.Time
		err = tx.QueryRow(ctx, "SELECT pending_until FROM devices WHERE account_id = $1 AND device_id = $2", accountID, device).Scan(&until)
		if err == nil {
			out = registration(device, deref(until), now)
			return nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		var pending *time.Time
		if had && delay > 0 {
			at := now.Add(delay)
			pending = &at
		}
		if _, err := tx.Exec(ctx, "INSERT INTO devices (account_id, device_id, registered_at, pending_until) VALUES ($1, $2, $3, $4)",
			accountID, device, now, pending); err != nil {
			return err
		}
		if !had {
			if _, err := tx.Exec(ctx, "UPDATE accounts SET had_registered_device = true WHERE id = $1", accountID); err != nil {
				return err
			}
		}
		out = registration(device, deref(pending), now)
		return nil
	})
	if err != nil {
		return DeviceRegistration{}, deviceErr("register device", err)
	}
	return out, nil
}

// Devices implements Ledger.
func (l *PostgresLedger) Devices(ctx context.Context, accountID string) ([]DeviceRegistration, error) {
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	if _, err := l.Account(ctx, accountID); err != nil {
		return nil, err
	}
	now, err := l.clock(ctx, l.pool)
	if err != nil {
		return nil, deviceErr("devices", err)
	}
	rows, err := l.pool.Query(ctx, "SELECT device_id, pending_until FROM devices WHERE account_id = $1 ORDER BY device_id", accountID)
	if err != nil {
		return nil, deviceErr("devices", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (DeviceRegistration, error) {
		var id string
		var until *time.Time
		err := row.Scan(&id, &until)
		return registration(id, deref(until), now), err
	})
	if err != nil {
		return nil, deviceErr("devices", err)
	}
	return out, nil
}

// ApproveDevice implements Ledger.
func (l *PostgresLedger) ApproveDevice(ctx context.Context, accountID, approver, device string) error {
	return l.approveDevice(ctx, accountID, approver, device)
}

// DeskApproveDevice implements Ledger.
func (l *PostgresLedger) DeskApproveDevice(ctx context.Context, accountID, device string) error {
	return l.approveDevice(ctx, accountID, deskActor, device)
}

// approveDevice registers device at once, approved by approver (deskActor: the support desk).
func (l *PostgresLedger) approveDevice(ctx context.Context, accountID, approver, device string) error {
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	err := l.change(ctx, func(tx pgx.Tx) error {
		if err := lockAccount(ctx, tx, accountID); err != nil {
			return err
		}
		if approver != deskActor { // the desk may approve any device the account asked to register
			now, err := l.clock(ctx, tx)
			if err != nil {
				return err
			}
			if ok, err := registeredDevice(ctx, tx, accountID, approver, now); err != nil || !ok {
				return cmpErr(err, ErrDeviceNotRegistered)
			}
		}
		tag, err := tx.Exec(ctx, "UPDATE devices SET pending_until = NULL WHERE account_id = $1 AND device_id = $2", accountID, device)
		if err == nil && tag.RowsAffected() == 0 {
			return ErrDeviceNotFound
		}
		return err
	})
	return deviceErr("approve device", err)
}

// RemoveDevice implements Ledger: the device's row deleted, its removal recorded, and the tier
// table's version moved, in one transaction. A call that will be refused is refused first
// without the account's row lock, which transfers take: a flood of removals by a device not
// registered, or of devices that are not there, makes no transfer wait.
func (l *PostgresLedger) RemoveDevice(ctx context.Context, accountID, actor, device string) error {
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	var account, actorOK, found bool
	if err := l.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM accounts WHERE id = $1),
		EXISTS (SELECT 1 FROM devices WHERE account_id = $1 AND device_id = $2
		AND (pending_until IS NULL OR pending_until <= coalesce($4::timestamptz, clock_timestamp()))),
		EXISTS (SELECT 1 FROM devices WHERE account_id = $1 AND device_id = $3)`,
		accountID, actor, device, l.at()).Scan(&account, &actorOK, &found); err != nil {
		return deviceErr("remove device", err)
	}
	switch {
	case !account:
		return ErrAccountNotFound
	case actor != device && !actorOK:
		return ErrDeviceNotRegistered
	case !found:
		return ErrDeviceNotFound
	}
	err := l.change(ctx, func(tx pgx.Tx) error {
		if err := lockAccount(ctx, tx, accountID); err != nil {
			return err
		}
		now, err := l.clock(ctx, tx) // the clock the logins' tokens are stamped with
		if err != nil {
			return err
		}
		if actor != device {
			if ok, err := registeredDevice(ctx, tx, accountID, actor, now); err != nil || !ok {
				return cmpErr(err, ErrDeviceNotRegistered)
			}
		}
		tag, err := tx.Exec(ctx, "DELETE FROM devices WHERE account_id = $1 AND device_id = $2", accountID, device)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return ErrDeviceNotFound
		}
		if _, err := tx.Exec(ctx, `INSERT INTO removed_devices (account_id, device_id, removed_at) VALUES ($1, $2, $3)
			ON CONFLICT (account_id, device_id) DO UPDATE SET removed_at = $3`, accountID, device, now); err != nil {
			return err
		}
		// The removals that refuse no live token any more go (WithTokenLifetime): each row once,
		// found by its index, so the log stays the size of a token's lifetime of removals.
		if l.tokensLive > 0 {
			if _, err := tx.Exec(ctx, "DELETE FROM removed_devices WHERE removed_at <= $1", now.Add(-l.tokensLive)); err != nil {
				return err
			}
		}
		_, err = tx.Exec(ctx, moveTierVersion)
		return err
	})
	return deviceErr("remove device", err)
}

// lockAccount takes the account's row lock, or returns ErrAccountNotFound.
func lockAccount(ctx context.Context, tx pgx.Tx, accountID string) error {
	var id string
	err := tx.QueryRow(ctx, "SELECT id FROM accounts WHERE id = $1 FOR UPDATE", accountID).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrAccountNotFound
	}
	return err
}

// registeredDevice reports whether device is registered for PIX at now.
func registeredDevice(ctx context.Context, tx pgx.Tx, accountID, device string, now time.Time) (bool, error) {
	var ok bool
	err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM devices WHERE account_id = $1 AND device_id = $2
		AND (pending_until IS NULL OR pending_until <= $3))`, accountID, device, now).Scan(&ok)
	return ok && device != "", err
}

// cmpErr is err, or instead when err is nil.
func cmpErr(err, instead error) error {
	if err != nil {
		return err
	}
	return instead
}

// deviceErr passes the domain errors through and wraps the rest as the ledger's unavailability.
func deviceErr(what string, err error) error {
	switch {
	case err == nil, errors.Is(err, ErrAccountNotFound), errors.Is(err, ErrDeviceNotFound), errors.Is(err, ErrDeviceNotRegistered):
		return err
	}
	return fmt.Errorf("pix: %s: %w", what, unavailable(err))
}

func deref(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}
