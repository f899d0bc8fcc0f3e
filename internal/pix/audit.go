package pix

import (
	"context"
	"time"
)

// AuditRecord is one call of the support desk, as the ledger keeps it: who, what, which
// rate-limit key (the limiter's own keyed hash, never an identity in clear), when, and the
// key's state before and after.
type AuditRecord struct {
	At     time.Time
	Actor  string // the desk's caller: a fingerprint of the token, and the agent it named
	Action string // "GET /admin/v1/keys/{policy}/{identity}", ...
	Status int    // the HTTP status answered
	Policy string
	Key    string // the Redis key, hashed as the limiter hashes it; "" when none was resolved
	Before string // the key's state before, as JSON; "" when not read
	After  string
}

// auditLog keeps the memory ledger's records.
type auditLog struct{ records []AuditRecord }

// Audit implements Ledger.
func (l *MemoryLedger) Audit(_ context.Context, r AuditRecord) error {
	l.mu.Lock()
	defer l.mu.Unlock()
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
	_, err := l.pool.Exec(ctx, `INSERT INTO admin_audit (at, actor, action, status, policy, key, before, after)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`, r.At.UTC(), r.Actor, r.Action, r.Status, r.Policy, r.Key, r.Before, r.After)
	return unavailable(err)
}

// AuditTrail implements Ledger.
func (l *PostgresLedger) AuditTrail(ctx context.Context, limit int) ([]AuditRecord, error) {
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	rows, err := l.pool.Query(ctx, `SELECT at, actor, action, status, policy, key, before, after FROM admin_audit
		ORDER BY seq DESC LIMIT $1`, limit)
	if err != nil {
		return nil, unavailable(err)
	}
	out, err := collectAudit(rows)
	return out, unavailable(err)
}
