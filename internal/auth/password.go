package auth

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/pixlimit/pixlimit/internal/pix"
)

// ErrInvalidCredentials is the one answer to a wrong password and to an unknown document alike,
// so that a login cannot be used to learn which CPFs are customers.
var ErrInvalidCredentials = errors.New("invalid document or password")

// DefaultPasswordCost is the bcrypt cost of a real deployment: bcrypt's own default, about 60 ms a
// comparison on one core. Nothing in the configuration lowers it; only code that builds a
// replica (a test) may pass a lower one.
const DefaultPasswordCost = bcrypt.DefaultCost

// ErrBusy is Check's answer when it could not start its comparison within its wait: the
// replica compares as many passwords as it has cores already.
var ErrBusy = errors.New("auth: every password comparison is in use")

// Passwords checks passwords against the ledger's bcrypt hashes. A login for an unknown document
// is compared against a dummy hash of the same cost as the accounts', so it takes as long as a
// wrong password.
//
// A comparison is tens of milliseconds of a core, and the login's limits admit many, from many
// addresses and documents: a botnet's logins, each within its keys, would take every core, and the
// replica's other requests (its limiter's decisions first) would miss their deadlines. So the
// replica compares at most one password per core at once; a login that finds none free within
// wait is answered ErrBusy, and what it would have cost is left to the others.
type Passwords struct {
	dummy []byte
	slots chan struct{} // a comparison holds one
	wait  time.Duration
}

// NewPasswords returns the checker of passwords hashed at cost (bcrypt.MinCost to MaxCost), the
// cost the accounts' hashes have: its dummy hash is made at that cost, once.
func NewPasswords(cost int) (*Passwords, error) {
	if cost < bcrypt.MinCost || cost > bcrypt.MaxCost { // bcrypt would quietly use its default
		return nil, fmt.Errorf("auth: password cost %d: want %d to %d", cost, bcrypt.MinCost, bcrypt.MaxCost)
	}
	dummy, err := bcrypt.GenerateFromPassword([]byte("pixlimit-dummy-password-never-matches"), cost)
	if err != nil {
		return nil, fmt.Errorf("auth: password cost %d: %w", cost, err)
	}
	return &Passwords{dummy: dummy, slots: make(chan struct{}, runtime.GOMAXPROCS(0)), wait: time.Second}, nil
}

// AccountFinder finds the account of a document.
type AccountFinder interface {
	AccountByDocument(ctx context.Context, document string) (pix.Account, error)
}

// Check returns the account of document if password is its password, and
// ErrInvalidCredentials otherwise, in comparable time whether or not the account exists.
// bcrypt's comparison is constant-time. ErrBusy: no comparison could start within the wait.
func (p *Passwords) Check(ctx context.Context, accounts AccountFinder, document, password string) (pix.Account, error) {
	acct, err := accounts.AccountByDocument(ctx, document)
	hash := acct.PasswordHash
	switch {
	case errors.Is(err, pix.ErrAccountNotFound):
		hash = p.dummy
	case err != nil:
		return pix.Account{}, err
	}
	if err := p.take(ctx); err != nil {
		return pix.Account{}, err
	}
	defer func() { <-p.slots }()
	compared := bcrypt.CompareHashAndPassword(hash, []byte(password))
	if compared != nil && !errors.Is(compared, bcrypt.ErrMismatchedHashAndPassword) {
		// A stored hash that is empty or no bcrypt hash (a bad import) fails before any work:
		// the dummy's comparison gives its answer a wrong password's time, or the login would
		// tell that the document is a customer's. (A hash of another cost than the dummy's
		// takes that cost's time: a deployment that raises the cost rehashes its accounts.)
		_ = bcrypt.CompareHashAndPassword(p.dummy, []byte(password))
	}
	if compared != nil || err != nil {
		return pix.Account{}, ErrInvalidCredentials
	}
	return acct, nil
}

// take waits for a comparison's slot, at most p.wait and while ctx lasts.
func (p *Passwords) take(ctx context.Context) error {
	select {
	case p.slots <- struct{}{}:
		return nil
	default:
	}
	timer := time.NewTimer(p.wait)
	defer timer.Stop()
	select {
	case p.slots <- struct{}{}:
		return nil
	case <-timer.C:
		return ErrBusy
	case <-ctx.Done():
		return ctx.Err()
	}
}
