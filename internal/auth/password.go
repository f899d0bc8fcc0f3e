package auth

import (
	"context"
	"errors"

	"golang.org/x/crypto/bcrypt"

	"github.com/pixlimit/pixlimit/internal/pix"
)

// ErrInvalidCredentials is the one answer to a wrong password and to an unknown document alike,
// so that a login cannot be used to learn which CPFs are customers.
var ErrInvalidCredentials = errors.New("invalid document or password")

// dummyHash is a bcrypt hash (cost 10, like the accounts') of a password nobody uses. A login
// for an unknown document is compared against it, so it takes as long as a wrong password.
var dummyHash = []byte("$2a$10$mpMq401b2.h20meNkEMW0eoiLLAI1VCzwbV.D53r45BPW2W8wlnUS")

// AccountFinder finds the account of a document.
type AccountFinder interface {
	AccountByDocument(ctx context.Context, document string) (pix.Account, error)
}

// CheckPassword returns the account of document if password is its password, and
// ErrInvalidCredentials otherwise, in comparable time whether or not the account exists.
// bcrypt's comparison is constant-time.
func CheckPassword(ctx context.Context, accounts AccountFinder, document, password string) (pix.Account, error) {
	acct, err := accounts.AccountByDocument(ctx, document)
	hash := acct.PasswordHash
	switch {
	case errors.Is(err, pix.ErrAccountNotFound):
		hash = dummyHash
	case err != nil:
		return pix.Account{}, err
	}
	if bcrypt.CompareHashAndPassword(hash, []byte(password)) != nil || err != nil {
		return pix.Account{}, ErrInvalidCredentials
	}
	return acct, nil
}
