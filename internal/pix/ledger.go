package pix

import (
	"context"
	"crypto/rand"
	"errors"
	"time"
)

// Errors a Ledger returns; the HTTP layer maps each to one status.
var (
	ErrAccountNotFound     = errors.New("account not found")
	ErrKeyNotFound         = errors.New("PIX key not found")
	ErrInsufficientFunds   = errors.New("insufficient funds")
	ErrSameAccount         = errors.New("payer and payee are the same account")
	ErrIdempotencyConflict = errors.New("idempotency key already used with a different request")
	ErrInvalidAmount       = errors.New("amount must be a positive number of cents, at most MaxAmountCents")
	// ErrIdempotencyKeyRequired: every transfer names its IdempotencyKey, so that a retry, after
	// any failure, is safe by construction.
	ErrIdempotencyKeyRequired = errors.New("a transfer needs an idempotency key")
	// ErrUnavailable is wrapped by every error that means the ledger could not answer within
	// its deadline (or at all) before anything was sent for commit: nothing was changed, and the
	// caller may retry later.
	ErrUnavailable = errors.New("ledger unavailable")
	// ErrOutcomeUnknown is wrapped by the error of a transfer whose COMMIT was sent but whose
	// outcome the ledger could not learn in time: the money may have moved. Retrying with the
	// same IdempotencyKey returns the transfer's Receipt if it was made, and makes it if not.
	ErrOutcomeUnknown = errors.New("transfer outcome unknown")
	// ErrChangeOutcomeUnknown is wrapped by the error of any other change (limits, devices,
	// tiers) whose COMMIT was sent but not answered: it may have been made. Read it back before
	// asking for it again.
	ErrChangeOutcomeUnknown = errors.New("change outcome unknown")
)

// MaxAmountCents is the largest amount one transfer may move: R$ 1.000.000.000,00. Far above any
// real PIX, and small enough that no sum the ledger keeps (a night's, a day's) can overflow.
const MaxAmountCents = 100_000_000_000

// Account is a customer account. Its balance lives in the Ledger.
type Account struct {
	ID       string
	Name     string
	Document string // CPF (11 digits) or CNPJ (14 characters), as ParseDocument returns it
	// PasswordHash is the bcrypt hash of the account's password.
	PasswordHash []byte
	// Keys are the account's PIX keys, normalized as ParseKey returns them.
	Keys []string
	// OpeningCents is the balance the account starts with.
	OpeningCents int64
}

// Ledger keeps accounts' balances and moves money between them. Implementations are safe for
// concurrent use, keep every balance non-negative and make each transfer all or nothing. It is
// the sum of what its callers need, each a small interface of its own: a handler takes the one
// it calls.
type Ledger interface {
	Payments
	MoneyLimitStore
	DeviceStore
	TierStore
	AuditLog
	Clock
}

// Clock is the ledger's clock, the one every replica reads the same: an access token's issue
// time and a revocation's are both read from it, so that a revocation refuses exactly the
// tokens issued before it, whichever replica issued them and whichever revoked.
type Clock interface {
	Now(ctx context.Context) (time.Time, error)
}

// Payments are the accounts, their PIX keys, and the money between them.
type Payments interface {
	// AccountByDocument finds the account of a document (as ParseDocument returns it), or
	// returns ErrAccountNotFound.
	AccountByDocument(ctx context.Context, document string) (Account, error)
	// Account finds an account by its id, or returns ErrAccountNotFound.
	Account(ctx context.Context, id string) (Account, error)
	// LookupKey finds the owner of a PIX key (normalized, as ParseKey returns it), or returns
	// ErrKeyNotFound.
	LookupKey(ctx context.Context, key string) (Payee, error)
	// Transfer moves money from one account to the owner of a PIX key. A request with the
	// IdempotencyKey of an earlier one from the same account returns the earlier Receipt and
	// moves nothing, or ErrIdempotencyConflict if the two requests differ. A failure wraps
	// ErrUnavailable when nothing was changed, ErrOutcomeUnknown when the money may have moved.
	Transfer(ctx context.Context, r TransferRequest) (Receipt, error)
	// Statement returns the account's balance and its newest entries, at most limit of them.
	Statement(ctx context.Context, accountID string, limit int) (Statement, error)
	// Busy says that every connection the ledger may hold is in use, none idle: a read asked
	// now would queue behind the payments in progress, so it should give way to them.
	Busy() bool
}

// MoneyLimitStore keeps each account's own money limits.
type MoneyLimitStore interface {
	// Limits returns the account's money limits in force now and its pending increases.
	Limits(ctx context.Context, accountID string) (MoneyLimits, error)
	// SetLimits changes the account's limits (Rules: lower at once, higher after the delay)
	// and returns them; an invalid change wraps ErrInvalidLimits and changes nothing.
	SetLimits(ctx context.Context, accountID string, c MoneyLimitsChange) (MoneyLimits, error)
	// CancelPendingLimits drops the account's pending increases and returns its limits.
	CancelPendingLimits(ctx context.Context, accountID string) (MoneyLimits, error)
}

// DeviceStore keeps the devices each account registered for PIX.
type DeviceStore interface {
	// RegisterDevice asks to register a device of the account for PIX, so that its transfers
	// are no longer capped as a new device's: at once only as the account's first registered
	// device ever, else (including after every device was revoked or removed) after delay (it then registers by itself), unless a registered device approves it
	// first (ApproveDevice) or it is removed (RemoveDevice). Asking again changes nothing.
	RegisterDevice(ctx context.Context, accountID, device string, delay time.Duration) (DeviceRegistration, error)
	// Devices lists the account's registered and pending devices.
	Devices(ctx context.Context, accountID string) ([]DeviceRegistration, error)
	// ApproveDevice registers a pending device at once, approved by a registered one
	// (ErrDeviceNotRegistered when approver is not; ErrDeviceNotFound when device is not pending
	// or registered).
	ApproveDevice(ctx context.Context, accountID, approver, device string) error
	// DeskApproveDevice is ApproveDevice by the support desk, which needs no registered device.
	DeskApproveDevice(ctx context.Context, accountID, device string) error
	// RemoveDevice cancels a pending registration or unregisters a device, and refuses its
	// access tokens issued until now (TierTable.RemovedDevices). A device not registered may
	// remove only itself (ErrDeviceNotRegistered); ErrDeviceNotFound when device is neither
	// pending nor registered.
	RemoveDevice(ctx context.Context, accountID, actor, device string) error
}

// TierStore keeps which limits each account is held to, and the revocations of its devices.
type TierStore interface {
	// TierTable returns the tiers and the accounts' assignments, with their version;
	// TierVersion the version alone, cheap enough to poll; SetTier moves an account to a tier
	// with its overrides (ErrUnknownTier, ErrAccountNotFound) and moves the version.
	TierTable(ctx context.Context) (TierTable, error)
	TierVersion(ctx context.Context) (int64, error)
	SetTier(ctx context.Context, accountID string, a TierOf) error
	// RevokeDevices revokes every trusted device of the account (support's answer to a stolen
	// phone): the tokens issued to it until now stop being honoured (TierTable.Revoked), its
	// devices registered for PIX are deleted, and the version moves (ErrAccountNotFound).
	RevokeDevices(ctx context.Context, accountID string) (Revocation, error)
}

// AuditLog keeps the support desk's trail.
type AuditLog interface {
	// Audit records one call of the support desk; AuditTrail returns the newest records, at
	// most limit of them.
	Audit(ctx context.Context, r AuditRecord) error
	AuditTrail(ctx context.Context, limit int) ([]AuditRecord, error)
}

// Payee is the owner of a PIX key, as a payer may see them before paying.
type Payee struct {
	Key      string
	Name     string
	Document string // CPF or CNPJ, as ParseDocument returns it
}

// TransferRequest asks to move AmountCents from account From to the owner of the key ToKey.
type TransferRequest struct {
	From           string
	ToKey          string // normalized, as ParseKey returns it
	AmountCents    int64
	Description    string
	IdempotencyKey string // required: names the transfer across retries
	// Device is the id of the device that asks (the access token's), "" when unknown: a device
	// the account has not registered (RegisterDevice) sends under the new-device caps.
	Device string
}

// same reports whether r and o are one transfer, as an idempotency key names it: the same payer,
// key, amount and description, from whichever device.
func (r TransferRequest) same(o TransferRequest) bool {
	r.Device, o.Device = "", ""
	return r == o
}

// betweenPersons reports whether a payment from document payer to document payee is between
// distinct natural persons (PF to PF), the payments the night cap covers. Documents are unique
// per account here, so one person's two accounts cannot exist; a payment between the same
// document's accounts would not be "between distinct persons" (Res. BCB 142/2021) and is not
// capped, which this comparison also says.
func betweenPersons(payer, payee string) bool {
	return PersonOf(payer) == PF && PersonOf(payee) == PF && payer != payee
}

// valid checks what every ledger requires of a transfer before it looks at any account.
func (r TransferRequest) valid() error {
	if r.AmountCents <= 0 || r.AmountCents > MaxAmountCents {
		return ErrInvalidAmount
	}
	if r.IdempotencyKey == "" {
		return ErrIdempotencyKeyRequired
	}
	return nil
}

// Receipt is the outcome of a transfer.
type Receipt struct {
	EndToEndID   string
	AmountCents  int64
	BalanceCents int64 // the payer's balance after the transfer
	ToKey        string
	ToName       string
	CreatedAt    time.Time
	// Replayed says the receipt is an earlier transfer's, answered again for a request with its
	// IdempotencyKey: nothing moved this time.
	Replayed bool
}

// Statement is an account's balance and latest entries, newest first.
type Statement struct {
	AccountID    string
	BalanceCents int64
	Entries      []Entry
}

// Direction says whether an entry took money out of the account or brought it in.
type Direction string

// Directions of an Entry.
const (
	Out Direction = "out"
	In  Direction = "in"
)

// Entry is one transfer seen from one account.
type Entry struct {
	EndToEndID   string
	Direction    Direction
	AmountCents  int64
	Counterparty string // the other account's holder name
	Description  string
	CreatedAt    time.Time
}

// ISPB is the 8-digit participant code in every end-to-end id; pixlimit is a fictional
// participant, so it uses one that no real institution has.
const ISPB = "99999999"

// NewEndToEndID returns an end-to-end id in the central bank's format: "E", the payer
// institution's ISPB, the UTC date and time to the minute (yyyyMMddHHmm) and 11 random
// alphanumerics (from crypto/rand's base32 text: 55 bits), 32 characters in all. Ledgers still
// enforce uniqueness.
func NewEndToEndID(now time.Time) string {
	return "E" + ISPB + now.UTC().Format("200601021504") + rand.Text()[:11]
}
