package pix

import (
	"context"
	"time"
)

// Timed returns l with every call reported to observe: its name, from a fixed set, how long it
// took and its error. The replica's metrics time its one ledger so (httpapi.Metrics.ObserveLedger).
func Timed(l Ledger, observe func(call string, took time.Duration, err error)) Ledger {
	return timedLedger{ledger: l, observe: observe}
}

// timedLedger names the Ledger it wraps rather than embedding it, so that a method added to
// Ledger fails to compile here until it is timed too.
type timedLedger struct {
	ledger  Ledger
	observe func(call string, took time.Duration, err error)
}

// timed runs one ledger call and reports it under call.
func timed[T any](l timedLedger, call string, f func() (T, error)) (T, error) {
	start := time.Now()
	v, err := f()
	l.observe(call, time.Since(start), err)
	return v, err
}

// errOnly adapts a call that returns only an error to timed.
func errOnly(err error) (struct{}, error) { return struct{}{}, err }

func (l timedLedger) AccountByDocument(ctx context.Context, document string) (Account, error) {
	return timed(l, "account", func() (Account, error) { return l.ledger.AccountByDocument(ctx, document) })
}

func (l timedLedger) Account(ctx context.Context, id string) (Account, error) {
	return timed(l, "account", func() (Account, error) { return l.ledger.Account(ctx, id) })
}

func (l timedLedger) Transfer(ctx context.Context, r TransferRequest) (Receipt, error) {
	return timed(l, "transfer", func() (Receipt, error) { return l.ledger.Transfer(ctx, r) })
}

func (l timedLedger) LookupKey(ctx context.Context, key string) (Payee, error) {
	return timed(l, "lookup", func() (Payee, error) { return l.ledger.LookupKey(ctx, key) })
}

func (l timedLedger) Statement(ctx context.Context, accountID string, limit int) (Statement, error) {
	return timed(l, "statement", func() (Statement, error) { return l.ledger.Statement(ctx, accountID, limit) })
}

// Busy is not timed: it asks the pool, not the database.
func (l timedLedger) Busy() bool { return l.ledger.Busy() }

func (l timedLedger) Limits(ctx context.Context, accountID string) (MoneyLimits, error) {
	return timed(l, "limits", func() (MoneyLimits, error) { return l.ledger.Limits(ctx, accountID) })
}

func (l timedLedger) SetLimits(ctx context.Context, accountID string, c MoneyLimitsChange) (MoneyLimits, error) {
	return timed(l, "set_limits", func() (MoneyLimits, error) { return l.ledger.SetLimits(ctx, accountID, c) })
}

func (l timedLedger) CancelPendingLimits(ctx context.Context, accountID string) (MoneyLimits, error) {
	return timed(l, "cancel_pending_limits", func() (MoneyLimits, error) { return l.ledger.CancelPendingLimits(ctx, accountID) })
}

func (l timedLedger) RegisterDevice(ctx context.Context, accountID, device string, delay time.Duration) (DeviceRegistration, error) {
	return timed(l, "register_device", func() (DeviceRegistration, error) { return l.ledger.RegisterDevice(ctx, accountID, device, delay) })
}

func (l timedLedger) Devices(ctx context.Context, accountID string) ([]DeviceRegistration, error) {
	return timed(l, "devices", func() ([]DeviceRegistration, error) { return l.ledger.Devices(ctx, accountID) })
}

func (l timedLedger) ApproveDevice(ctx context.Context, accountID, approver, device string) error {
	_, err := timed(l, "approve_device", func() (struct{}, error) { return errOnly(l.ledger.ApproveDevice(ctx, accountID, approver, device)) })
	return err
}

func (l timedLedger) DeskApproveDevice(ctx context.Context, accountID, device string) error {
	_, err := timed(l, "approve_device", func() (struct{}, error) { return errOnly(l.ledger.DeskApproveDevice(ctx, accountID, device)) })
	return err
}

func (l timedLedger) Now(ctx context.Context) (time.Time, error) {
	return timed(l, "clock", func() (time.Time, error) { return l.ledger.Now(ctx) })
}

func (l timedLedger) RemoveDevice(ctx context.Context, accountID, actor, device string) error {
	_, err := timed(l, "remove_device", func() (struct{}, error) { return errOnly(l.ledger.RemoveDevice(ctx, accountID, actor, device)) })
	return err
}

func (l timedLedger) Audit(ctx context.Context, r AuditRecord) error {
	_, err := timed(l, "audit", func() (struct{}, error) { return errOnly(l.ledger.Audit(ctx, r)) })
	return err
}

func (l timedLedger) AuditTrail(ctx context.Context, limit int) ([]AuditRecord, error) {
	return timed(l, "audit_trail", func() ([]AuditRecord, error) { return l.ledger.AuditTrail(ctx, limit) })
}

func (l timedLedger) TierTable(ctx context.Context) (TierTable, error) {
	return timed(l, "tier_table", func() (TierTable, error) { return l.ledger.TierTable(ctx) })
}

func (l timedLedger) TierVersion(ctx context.Context) (int64, error) {
	return timed(l, "tier_version", func() (int64, error) { return l.ledger.TierVersion(ctx) })
}

func (l timedLedger) SetTier(ctx context.Context, accountID string, a TierOf) error {
	_, err := timed(l, "set_tier", func() (struct{}, error) { return errOnly(l.ledger.SetTier(ctx, accountID, a)) })
	return err
}

func (l timedLedger) RevokeDevices(ctx context.Context, accountID string) (Revocation, error) {
	return timed(l, "revoke_devices", func() (Revocation, error) { return l.ledger.RevokeDevices(ctx, accountID) })
}
