package pix

import (
	"context"
	"time"
)

// AuditRecord is one call of the support desk, as the ledger keeps it: who, what, which
// rate-limit key or account (a keyed hash, never an identity in clear), when, and the state
// before and after. A change is recorded before it is made (OutcomeRequested) and after
// (OutcomeDone or OutcomeFailed), under one Request id.
type AuditRecord struct {
	At      time.Time
	Actor   string // the desk's caller: a fingerprint of the token, and the agent it named
	Action  string // "GET /admin/v1/keys/{policy}/{identity}", ...
	Status  int    // the HTTP status answered; 0 in a requested record
	Policy  string
	Key     string // the Redis key, hashed as the limiter hashes it; "" when none was resolved
	Before  string // the key's state before, as JSON; "" when not read
	After   string
	Outcome string // OutcomeRequested, OutcomeDone, OutcomeFailed, OutcomeUnknown or OutcomeRefused
	Request string // pairs a change's requested record with its outcome
	Calls   int    // how many calls the record stands for: 1, or a summary's count
}

// The outcomes an audit record states.
const (
	OutcomeRequested = "requested" // a change about to be made
	OutcomeDone      = "done"      // answered below 400
	OutcomeFailed    = "failed"    // answered 400 or above: nothing was changed
	OutcomeUnknown   = "unknown"   // answered change_outcome_unknown: the change may have been made
	OutcomeRefused   = "refused"   // calls without the right token, summarized per IP and minute
)

// auditLog keeps the memory ledger's records.
type auditLog struct{ records []AuditRecord }

// Audit implements Ledger.
func (l *MemoryLedger) Audit(_ context.Context, r AuditRecord) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	r.Calls = max(r.Calls, 1)
	l.audit.records = append(l.audit.records, r)
	return nil
}

// AuditTrail implements Ledger.
func (l *MemoryLedger) AuditTrail(_ context.Context, limit int) ([]AuditRecord, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := min(max(limit, 0), len(l.audit.records))
	out := make([]AuditRecord, n)
	for i := range n {
		out[i] = l.audit.records[len(l.audit.records)-1-i]
	}
	return out, nil
}

// Audit implements Ledger.
func (l *PostgresLedger) Audit(ctx context.Context, r AuditRecord) error {
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	_, err := l.pool.Exec(ctx, `INSERT INTO admin_audit (at, actor, action, status, policy, key, before, after, outcome, request, calls)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`, r.At.UTC(), r.Actor, r.Action, r.Status, r.Policy, r.Key, r.Before, r.After,
		r.Outcome, r.Request, max(r.Calls, 1))
	return unavailable(err)
}

// AuditTrail implements Ledger.
func (l *PostgresLedger) AuditTrail(ctx context.Context, limit int) ([]AuditRecord, error) {
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	rows, err := l.pool.Query(ctx, `SELECT at, actor, action, status, policy, key, before, after, outcome, request, calls FROM admin_audit
		ORDER BY seq DESC LIMIT $1`, limit)
	if err != nil {
		return nil, unavailable(err)
	}
	out, err := collectAudit(rows)
	return out, unavailable(err)
}
