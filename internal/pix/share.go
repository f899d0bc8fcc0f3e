package pix

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// ErrLedgerBusy: the account already holds its share of the replica's ledger connections, and
// none came free within the wait. Nothing was asked of the ledger: nothing changed.
var ErrLedgerBusy = errors.New("ledger busy: the account holds its share of the ledger's connections")

// Share bounds how many of a replica's ledger calls one account has in progress at once: its
// share of the pool (LEDGER_ACCOUNT_SHARE, below the pool's size). An account that floods any
// route, however its other limits treat it, then holds at most that many of the connections
// while the rest serve everyone else, its own calls waiting their turn. A call that finds no
// place within the wait is answered ErrLedgerBusy, having asked the ledger nothing.
//
// The places are a customer's (ForCustomer): her account's calls and the logins that name her
// document share them, or a login flood beside her PIX would hold twice her share.
//
// It costs a map look-up and a channel operation under one mutex per call; it keeps an entry per
// account with a call in progress, and none for the others.
type Share struct {
	per  int
	wait time.Duration
	mu   sync.Mutex
	held map[string]*places
}

// places are one account's: a token in the channel per call in progress, and how many calls
// hold or wait for one (the entry goes when none does).
type places struct {
	tokens chan struct{}
	users  int
}

// NewShare lets each account hold per calls at once, a call waiting at most wait for its turn.
func NewShare(per int, wait time.Duration) (*Share, error) {
	if per < 1 || wait <= 0 {
		return nil, fmt.Errorf("pix: a ledger share of %d calls waiting %v: want at least 1 and a positive wait", per, wait)
	}
	return &Share{per: per, wait: wait, held: map[string]*places{}}, nil
}

// holding marks a context whose caller holds a place of the account it names (Hold): the
// ledger calls made under it take none of their own.
type holding struct{}

// customer marks a context whose calls take the places of the customer it names (ForCustomer).
type customer struct{}

// ForCustomer has the calls made under ctx take the places of one customer, named by a stable
// name of her document (auth's PayerID): a login's look-up knows the document before the account,
// and every call of her account's routes carries it, so both count against one share. Without it,
// an account's calls take its account's places, and a login's look-up its document's.
func ForCustomer(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, customer{}, name)
}

// holderOf is whose places a call of account under ctx takes: ctx's customer's, or account's.
func holderOf(ctx context.Context, account string) string {
	if c, _ := ctx.Value(customer{}).(string); c != "" {
		return c
	}
	return account
}

// Hold takes one of account's places for a sequence of calls (a PIX: its admission and its
// transfer), waiting its turn at most the share's wait and within (what the caller's deadline
// leaves), else ErrLedgerBusy; a ctx that ends first returns its error (the client left: nothing
// was decided). The calls made with the context it returns take no place of their own; release
// gives it back.
func (s *Share) Hold(ctx context.Context, account string, within time.Duration) (context.Context, func(), error) {
	account = holderOf(ctx, account)
	if held, _ := ctx.Value(holding{}).(string); held == account {
		return ctx, func() {}, nil
	}
	release, err := s.take(ctx, account, min(s.wait, within))
	if err != nil {
		return ctx, nil, err
	}
	return context.WithValue(ctx, holding{}, account), release, nil
}

// Full says whether account (ctx's customer) holds every one of its places now: a call would
// wait its turn.
func (s *Share) Full(ctx context.Context, account string) bool {
	account = holderOf(ctx, account)
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.held[account]
	return p != nil && len(p.tokens) == s.per
}

// take waits for one of account's places, at most wait.
func (s *Share) take(ctx context.Context, account string, wait time.Duration) (func(), error) {
	s.mu.Lock()
	p := s.held[account]
	if p == nil {
		p = &places{tokens: make(chan struct{}, s.per)}
		s.held[account] = p
	}
	p.users++
	s.mu.Unlock()
	leave := func() {
		s.mu.Lock()
		if p.users--; p.users == 0 {
			delete(s.held, account)
		}
		s.mu.Unlock()
	}
	select {
	case p.tokens <- struct{}{}:
	default:
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case p.tokens <- struct{}{}:
		case <-t.C:
			leave()
			return nil, ErrLedgerBusy
		case <-ctx.Done():
			leave()
			return nil, ctx.Err()
		}
	}
	return func() { <-p.tokens; leave() }, nil
}

// call runs f in one of account's places, unless ctx holds one already.
func call[T any](s *Share, ctx context.Context, account string, f func() (T, error)) (T, error) {
	account = holderOf(ctx, account)
	if held, _ := ctx.Value(holding{}).(string); held == account || account == "" {
		return f()
	}
	release, err := s.take(ctx, account, s.wait)
	if err != nil {
		var zero T
		return zero, err
	}
	defer release()
	return f()
}

// done adapts a call that returns only an error to call.
func done(err error) (struct{}, error) { return struct{}{}, err }

// Shared returns l with every call of an account's made in one of its places of s: the ledger
// as the customers' routes call it. The support desk and the tier poller call l itself: they are
// neither counted nor held back. A key's look-up names no account: its route holds one (Hold).
func Shared(l Ledger, s *Share) Ledger { return shared{l: l, s: s} }

// shared is Shared's Ledger. It names the Ledger it wraps rather than embedding it, so that a
// method added to Ledger fails to compile here until it is counted too.
type shared struct {
	l Ledger
	s *Share
}

// byDocument is the place a login's look-up takes when ctx names no customer: the account is not
// known yet.
func byDocument(document string) string { return "document:" + document }

func (x shared) AccountByDocument(ctx context.Context, document string) (Account, error) {
	return call(x.s, ctx, byDocument(document), func() (Account, error) { return x.l.AccountByDocument(ctx, document) })
}

func (x shared) Account(ctx context.Context, id string) (Account, error) {
	return call(x.s, ctx, id, func() (Account, error) { return x.l.Account(ctx, id) })
}

func (x shared) LookupKey(ctx context.Context, key string) (Payee, error) {
	held, _ := ctx.Value(holding{}).(string)
	return call(x.s, ctx, held, func() (Payee, error) { return x.l.LookupKey(ctx, key) })
}

func (x shared) Transfer(ctx context.Context, r TransferRequest) (Receipt, error) {
	return call(x.s, ctx, r.From, func() (Receipt, error) { return x.l.Transfer(ctx, r) })
}

func (x shared) Statement(ctx context.Context, accountID string, limit int) (Statement, error) {
	return call(x.s, ctx, accountID, func() (Statement, error) { return x.l.Statement(ctx, accountID, limit) })
}

func (x shared) Busy() bool { return x.l.Busy() }

func (x shared) Limits(ctx context.Context, accountID string) (MoneyLimits, error) {
	return call(x.s, ctx, accountID, func() (MoneyLimits, error) { return x.l.Limits(ctx, accountID) })
}

func (x shared) SetLimits(ctx context.Context, accountID string, c MoneyLimitsChange) (MoneyLimits, error) {
	return call(x.s, ctx, accountID, func() (MoneyLimits, error) { return x.l.SetLimits(ctx, accountID, c) })
}

func (x shared) CancelPendingLimits(ctx context.Context, accountID string) (MoneyLimits, error) {
	return call(x.s, ctx, accountID, func() (MoneyLimits, error) { return x.l.CancelPendingLimits(ctx, accountID) })
}

func (x shared) RegisterDevice(ctx context.Context, accountID, device string, delay time.Duration) (DeviceRegistration, error) {
	return call(x.s, ctx, accountID, func() (DeviceRegistration, error) { return x.l.RegisterDevice(ctx, accountID, device, delay) })
}

func (x shared) Devices(ctx context.Context, accountID string) ([]DeviceRegistration, error) {
	return call(x.s, ctx, accountID, func() ([]DeviceRegistration, error) { return x.l.Devices(ctx, accountID) })
}

func (x shared) ApproveDevice(ctx context.Context, accountID, approver, device string) error {
	_, err := call(x.s, ctx, accountID, func() (struct{}, error) { return done(x.l.ApproveDevice(ctx, accountID, approver, device)) })
	return err
}

func (x shared) RemoveDevice(ctx context.Context, accountID, actor, device string) error {
	_, err := call(x.s, ctx, accountID, func() (struct{}, error) { return done(x.l.RemoveDevice(ctx, accountID, actor, device)) })
	return err
}

// The desk's, the poller's and the clock's calls name no customer's account: not counted.

func (x shared) DeskApproveDevice(ctx context.Context, accountID, device string) error {
	return x.l.DeskApproveDevice(ctx, accountID, device)
}
func (x shared) TierTable(ctx context.Context) (TierTable, error) { return x.l.TierTable(ctx) }
func (x shared) TierVersion(ctx context.Context) (int64, error)   { return x.l.TierVersion(ctx) }
func (x shared) Now(ctx context.Context) (time.Time, error)       { return x.l.Now(ctx) }
func (x shared) Audit(ctx context.Context, r AuditRecord) error   { return x.l.Audit(ctx, r) }
func (x shared) SetTier(ctx context.Context, id string, a TierOf) error {
	return x.l.SetTier(ctx, id, a)
}
func (x shared) RevokeDevices(ctx context.Context, id string) (Revocation, error) {
	return x.l.RevokeDevices(ctx, id)
}
func (x shared) AuditTrail(ctx context.Context, limit int) ([]AuditRecord, error) {
	return x.l.AuditTrail(ctx, limit)
}
