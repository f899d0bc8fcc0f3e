package auth

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
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
// replica compares at most one password per core at once; a check that finds none free within
// wait is answered ErrBusy, and what it would have cost is left to the others.
//
// The checks that wait take turns by where they come from (From): a login that presents a device
// token of its own document, or an access token's bearer, and anyone else. A botnet holds no such
// token for the documents it tries (its own account's token counts for its own document alone),
// so a customer on a device she used waits at most a turn behind its flood. (A faster answer for
// the right document tells a thief holding a stolen token whose it is; so does the login's
// device key, which a full document key does not refuse: the token was the lane's price before,
// and a botnet's one token of its own put its whole flood in the customers' lane.)
type Passwords struct {
	dummy []byte
	wait  time.Duration

	mu      sync.Mutex
	free    int                // comparisons that may start now
	waiting [2][]chan struct{} // the checks waiting for one, by From, each in arrival order
	next    From               // whose turn comes next when both wait

	// stopped, when set (tests only), runs when a check has stopped waiting, before it looks
	// whether its turn came meanwhile.
	stopped func()
}

// From says where a check comes from, for its turn (Passwords).
type From int

const (
	Anyone  From = iota // a login with no device token of its document
	Trusted             // a login with a device token of its document, or an access token's bearer
)

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
	return &Passwords{dummy: dummy, free: runtime.GOMAXPROCS(0), wait: time.Second, next: Trusted}, nil
}

// AccountFinder finds the account of a document.
type AccountFinder interface {
	AccountByDocument(ctx context.Context, document string) (pix.Account, error)
}

// Check returns the account of document if password is its password, and
// ErrInvalidCredentials otherwise, in comparable time whether or not the account exists.
// bcrypt's comparison is constant-time. ErrBusy: no comparison could start within the wait.
func (p *Passwords) Check(ctx context.Context, accounts AccountFinder, document, password string, from From) (pix.Account, error) {
	acct, err := accounts.AccountByDocument(ctx, document)
	hash := acct.PasswordHash
	switch {
	case errors.Is(err, pix.ErrAccountNotFound):
		hash = p.dummy
	case err != nil:
		return pix.Account{}, err
	}
	if err := p.take(ctx, from); err != nil {
		return pix.Account{}, err
	}
	defer p.give()
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

// take waits for a comparison to start, at most p.wait and while ctx lasts: at once if one is
// free and no one waits (give hands a freed one to a check waiting).
func (p *Passwords) take(ctx context.Context, from From) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	p.mu.Lock()
	if p.free > 0 && len(p.waiting[Trusted])+len(p.waiting[Anyone]) == 0 {
		p.free--
		p.mu.Unlock()
		return nil
	}
	turn := make(chan struct{}, 1)
	q := &p.waiting[from]
	*q = append(*q, turn)
	p.mu.Unlock()

	timer := time.NewTimer(p.wait)
	defer timer.Stop()
	var err error
	select {
	case <-turn:
		return nil
	case <-timer.C:
		err = ErrBusy
	case <-ctx.Done():
		err = ctx.Err()
	}
	if p.stopped != nil {
		p.stopped()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if i := slices.Index(*q, turn); i >= 0 {
		*q = slices.Delete(*q, i, i+1)
		return err
	}
	if errors.Is(err, ErrBusy) { // its turn came as its wait ended: it takes it
		return nil
	}
	p.free++ // its turn came as its client left: the next one's
	p.passLocked()
	return err
}

// give ends a comparison: its turn goes to a check waiting.
func (p *Passwords) give() {
	p.mu.Lock()
	p.free++
	p.passLocked()
	p.mu.Unlock()
}

// passLocked hands a free comparison to the first check waiting in the lane whose turn it is,
// or, that lane empty, in the other.
func (p *Passwords) passLocked() {
	for _, from := range []From{p.next, 1 - p.next} {
		if q := p.waiting[from]; p.free > 0 && len(q) > 0 {
			p.free--
			q[0] <- struct{}{}
			p.waiting[from] = q[1:]
			p.next = 1 - from
			return
		}
	}
}
