package pix

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"
)

// MemoryLedger is a Ledger in one process's memory: the embedded default, for one replica. One
// mutex serializes transfers, which makes each trivially atomic.
type MemoryLedger struct {
	now   func() time.Time
	night NightCap

	mu       sync.Mutex
	accounts map[string]*memAccount // by id
	byDoc    map[string]string      // document → id
	byKey    map[string]string      // PIX key → id
	ids      map[string]bool        // end-to-end ids issued
	replays  map[idemKey]idemRecord
}

type memAccount struct {
	Account
	balance int64
	entries []Entry // oldest first
}

type idemKey struct{ account, key string }

type idemRecord struct {
	req     TransferRequest
	receipt Receipt
}

// NewMemoryLedger returns a ledger holding accounts at their opening balances.
func NewMemoryLedger(accounts []Account, opts ...Option) (*MemoryLedger, error) {
	o := newOptions(opts)
	l := &MemoryLedger{
		now:      o.now,
		night:    o.night,
		accounts: map[string]*memAccount{},
		byDoc:    map[string]string{},
		byKey:    map[string]string{},
		ids:      map[string]bool{},
		replays:  map[idemKey]idemRecord{},
	}
	for _, a := range accounts {
		if _, dup := l.accounts[a.ID]; dup {
			return nil, fmt.Errorf("pix: duplicate account id %q", a.ID)
		}
		if a.OpeningCents < 0 {
			return nil, fmt.Errorf("pix: account %s: negative opening balance", a.ID)
		}
		l.accounts[a.ID] = &memAccount{Account: a, balance: a.OpeningCents}
		l.byDoc[a.Document] = a.ID
		for _, k := range a.Keys {
			if _, dup := l.byKey[k]; dup {
				return nil, fmt.Errorf("pix: PIX key registered twice")
			}
			l.byKey[k] = a.ID
		}
	}
	return l, nil
}

// AccountByDocument implements Ledger.
func (l *MemoryLedger) AccountByDocument(_ context.Context, document string) (Account, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	id, ok := l.byDoc[document]
	if !ok {
		return Account{}, ErrAccountNotFound
	}
	return l.accounts[id].Account, nil
}

// Transfer implements Ledger.
func (l *MemoryLedger) Transfer(_ context.Context, r TransferRequest) (Receipt, error) {
	if err := r.valid(); err != nil {
		return Receipt{}, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if rec, ok := l.replays[idemKey{r.From, r.IdempotencyKey}]; ok {
		if rec.req != r {
			return Receipt{}, ErrIdempotencyConflict
		}
		replay := rec.receipt
		replay.Replayed = true
		return replay, nil
	}
	from, ok := l.accounts[r.From]
	if !ok {
		return Receipt{}, ErrAccountNotFound
	}
	toID, ok := l.byKey[r.ToKey]
	if !ok {
		return Receipt{}, ErrKeyNotFound
	}
	to := l.accounts[toID]
	if to == from {
		return Receipt{}, ErrSameAccount
	}
	if from.balance < r.AmountCents {
		return Receipt{}, ErrInsufficientFunds
	}
	now := l.now().UTC()
	if err := l.night.check(now, from.sentSince(l.night, now), r.AmountCents); err != nil {
		return Receipt{}, err
	}
	if to.balance > math.MaxInt64-r.AmountCents {
		// Unreachable while money is only moved, never created: no balance exceeds the total.
		return Receipt{}, fmt.Errorf("pix: balance of %s would overflow", to.ID)
	}

	id := NewEndToEndID(now)
	for l.ids[id] {
		id = NewEndToEndID(now)
	}
	l.ids[id] = true
	from.balance -= r.AmountCents
	to.balance += r.AmountCents
	from.entries = append(from.entries, Entry{EndToEndID: id, Direction: Out, AmountCents: r.AmountCents,
		Counterparty: to.Name, Description: r.Description, CreatedAt: now})
	to.entries = append(to.entries, Entry{EndToEndID: id, Direction: In, AmountCents: r.AmountCents,
		Counterparty: from.Name, Description: r.Description, CreatedAt: now})

	receipt := Receipt{EndToEndID: id, AmountCents: r.AmountCents, BalanceCents: from.balance,
		ToKey: r.ToKey, ToName: to.Name, CreatedAt: now}
	l.replays[idemKey{r.From, r.IdempotencyKey}] = idemRecord{req: r, receipt: receipt}
	return receipt, nil
}

// LookupKey implements Ledger.
func (l *MemoryLedger) LookupKey(_ context.Context, key string) (Payee, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	id, ok := l.byKey[key]
	if !ok {
		return Payee{}, ErrKeyNotFound
	}
	a := l.accounts[id]
	return Payee{Key: key, Name: a.Name, Document: a.Document}, nil
}

// sentSince is what the account has sent since the night containing now began (0 by day).
func (a *memAccount) sentSince(n NightCap, now time.Time) int64 {
	start, night := n.nightOf(now)
	if !night {
		return 0
	}
	spent := int64(0)
	for i := len(a.entries) - 1; i >= 0 && !a.entries[i].CreatedAt.Before(start); i-- {
		if a.entries[i].Direction == Out {
			spent += a.entries[i].AmountCents
		}
	}
	return spent
}

// Statement implements Ledger.
func (l *MemoryLedger) Statement(_ context.Context, accountID string, limit int) (Statement, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	a, ok := l.accounts[accountID]
	if !ok {
		return Statement{}, ErrAccountNotFound
	}
	n := min(max(limit, 0), len(a.entries))
	s := Statement{AccountID: a.ID, BalanceCents: a.balance, Entries: make([]Entry, n)}
	for i := range n {
		s.Entries[i] = a.entries[len(a.entries)-1-i]
	}
	return s, nil
}
