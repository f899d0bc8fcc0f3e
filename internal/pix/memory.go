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
	rules Rules

	mu       sync.Mutex
	accounts map[string]*memAccount // by id
	byDoc    map[string]string      // document → id
	byKey    map[string]string      // PIX key → id
	ids      map[string]bool        // end-to-end ids issued
	replays  map[idemKey]idemRecord
	audit    auditLog
	tiers    tierStore
	// calls bounds the transfers and statements in progress, as a database's connection pool
	// does (MemoryCalls of them): Busy reports it full.
	calls chan struct{}
}

// MemoryCalls is how many transfers and statements a MemoryLedger serves at once, as a pool
// of connections would, so that reads give way to payments here too. It is wider than a
// database's pool (pgxpool's is 4 on two cores): a call here holds its place for microseconds,
// not a round trip, and at 4 a burst of statements that merely overlapped was shed (a stress
// run: 3 of 45 concurrent statements over three replicas answered ledger_busy).
const MemoryCalls = 64

// call takes a place among the calls in progress, waiting for one up to ctx, and returns its
// release.
func (l *MemoryLedger) call(ctx context.Context) (func(), error) {
	select {
	case l.calls <- struct{}{}:
		return func() { <-l.calls }, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, ctx.Err())
	}
}

// Busy implements Ledger: every place for a call is taken.
func (l *MemoryLedger) Busy() bool { return len(l.calls) == cap(l.calls) }

type memAccount struct {
	Account
	balance int64
	entries []Entry   // oldest first
	sent    []memSent // the transfers it sent, oldest first
	limits  accountLimits
	devices map[string]time.Time // asked to register for PIX: pending until then, zero when approved (devices.go)
	// hadDevice: the account has had a registered device (every device asked registers, at once
	// or by itself): later ones wait, even after all were revoked or removed.
	hadDevice bool
}

// memSent is one transfer an account sent, as its money limits count it.
type memSent struct {
	at             time.Time
	amount         int64
	betweenPersons bool
	unregistered   bool
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
		rules:    o.rules,
		accounts: map[string]*memAccount{},
		byDoc:    map[string]string{},
		byKey:    map[string]string{},
		ids:      map[string]bool{},
		replays:  map[idemKey]idemRecord{},
		tiers:    newTierStore(),
		calls:    make(chan struct{}, MemoryCalls),
	}
	for _, a := range accounts {
		if _, dup := l.accounts[a.ID]; dup {
			return nil, fmt.Errorf("pix: duplicate account id %q", a.ID)
		}
		if a.OpeningCents < 0 {
			return nil, fmt.Errorf("pix: account %s: negative opening balance", a.ID)
		}
		l.accounts[a.ID] = &memAccount{Account: a, balance: a.OpeningCents, devices: map[string]time.Time{}}
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

// Now implements Ledger: the ledger's clock.
// Its clock counts microseconds, as PostgreSQL's: the tokens and revocations it stamps compare
// as they would there (auth's revokedBy).
func (l *MemoryLedger) Now(context.Context) (time.Time, error) { return l.clock(), nil }

// clock is the ledger's time in microseconds, UTC: what it stamps revocations and removals with.
func (l *MemoryLedger) clock() time.Time { return l.now().UTC().Truncate(time.Microsecond) }

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
func (l *MemoryLedger) Transfer(ctx context.Context, r TransferRequest) (Receipt, error) {
	if err := r.valid(); err != nil {
		return Receipt{}, err
	}
	release, err := l.call(ctx)
	if err != nil {
		return Receipt{}, err
	}
	defer release()
	l.mu.Lock()
	defer l.mu.Unlock()
	if rec, ok := l.replays[idemKey{r.From, r.IdempotencyKey}]; ok {
		if !rec.req.same(r) {
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
	now := l.clock()
	facts := transferFacts{now: now, amount: r.AmountCents, betweenPersons: betweenPersons(from.Document, to.Document),
		deviceRegistered: from.registered(r.Device, now), limits: l.rules.inForce(from.limits, now)}
	if err := l.rules.check(facts, from.spent(l.rules, facts)); err != nil {
		return Receipt{}, err // the limits first, then the balance, as PostgresLedger checks them
	}
	if from.balance < r.AmountCents {
		return Receipt{}, ErrInsufficientFunds
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
	from.sent = append(from.sent, memSent{at: now, amount: r.AmountCents, betweenPersons: facts.betweenPersons, unregistered: !facts.deviceRegistered})
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

// spent is what the account sent in the periods a transfer's limits count (Rules.periods).
func (a *memAccount) spent(r Rules, t transferFacts) sent {
	night, day := r.periods(t.now, t.limits.NightStart)
	var s sent
	for i := len(a.sent) - 1; i >= 0; i-- {
		e := a.sent[i]
		inNight, inDay := !night.IsZero() && !e.at.Before(night), !e.at.Before(day)
		if !inNight && !inDay {
			break
		}
		if inNight && e.betweenPersons {
			s.night += e.amount
		}
		if inDay {
			s.day += e.amount
			if e.unregistered {
				s.unregistered += e.amount
			}
		}
	}
	return s
}

// Account implements Ledger.
func (l *MemoryLedger) Account(_ context.Context, id string) (Account, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	a, ok := l.accounts[id]
	if !ok {
		return Account{}, ErrAccountNotFound
	}
	return a.Account, nil
}

// Limits implements Ledger.
func (l *MemoryLedger) Limits(_ context.Context, accountID string) (MoneyLimits, error) {
	return l.changeLimits(accountID, func(a accountLimits, _ time.Time) (accountLimits, error) { return a, nil })
}

// SetLimits implements Ledger.
func (l *MemoryLedger) SetLimits(_ context.Context, accountID string, c MoneyLimitsChange) (MoneyLimits, error) {
	return l.changeLimits(accountID, func(a accountLimits, now time.Time) (accountLimits, error) { return l.rules.change(a, c, now) })
}

// CancelPendingLimits implements Ledger.
func (l *MemoryLedger) CancelPendingLimits(_ context.Context, accountID string) (MoneyLimits, error) {
	return l.changeLimits(accountID, func(a accountLimits, now time.Time) (accountLimits, error) {
		a = a.settle(now) // what is due has applied: only what is not yet is cancelled
		a.pending = nil
		return a, nil
	})
}

// changeLimits runs change over an account's limits under the ledger's lock, keeps what it
// returns, and returns the limits in force, as PostgresLedger.changeLimits does in a transaction.
func (l *MemoryLedger) changeLimits(account string, change func(accountLimits, time.Time) (accountLimits, error)) (MoneyLimits, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	a, ok := l.accounts[account]
	if !ok {
		return MoneyLimits{}, ErrAccountNotFound
	}
	now := l.clock()
	changed, err := change(a.limits, now)
	if err != nil {
		return MoneyLimits{}, err
	}
	a.limits = changed
	return l.rules.inForce(a.limits, now), nil
}

// Statement implements Ledger.
func (l *MemoryLedger) Statement(ctx context.Context, accountID string, limit int) (Statement, error) {
	release, err := l.call(ctx)
	if err != nil {
		return Statement{}, err
	}
	defer release()
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
