package pix

import (
	"errors"
	"fmt"
	"time"
	_ "time/tzdata" // America/Sao_Paulo on any host, distroless images included
)

// NightCap is the PIX rulebook's night-time value cap for individuals: between Start and End,
// local time in Location, the transfers an account sends to other persons may not sum past
// LimitCents per night (Rules says to whom it applies, and the customer may choose its start).
// It is a limit on money, so it lives in the ledger's transaction, beside the balance it
// protects, never in Redis: a rate limit may forget its state on a Redis restart and cost at most
// one fresh window; a money limit must not forget anything.
type NightCap struct {
	LimitCents int64
	// Start and End are times of day since midnight (20h and 6h by default). A night that
	// starts after it ends spans midnight.
	Start, End time.Duration
	Location   *time.Location
}

// DefaultNightCap is R$ 1.000,00 between 20:00 and 06:00 in America/Sao_Paulo.
func DefaultNightCap() (NightCap, error) {
	loc, err := time.LoadLocation("America/Sao_Paulo")
	if err != nil {
		return NightCap{}, fmt.Errorf("pix: night cap: %w", err)
	}
	return NightCap{LimitCents: 100_000, Start: 20 * time.Hour, End: 6 * time.Hour, Location: loc}, nil
}

// nightOf returns when the night containing t began, and whether t is in a night at all.
func (n NightCap) nightOf(t time.Time) (time.Time, bool) {
	if n.Location == nil || n.Start == n.End {
		return time.Time{}, false
	}
	local := t.In(n.Location)
	y, m, d := local.Date()
	at := func(day int, since time.Duration) time.Time {
		return time.Date(y, m, day, int(since/time.Hour), int(since%time.Hour/time.Minute), int(since%time.Minute/time.Second), 0, n.Location)
	}
	start, end := at(d, n.Start), at(d, n.End)
	switch {
	case n.Start < n.End: // within one day
		return start, !local.Before(start) && local.Before(end)
	case !local.Before(start): // spans midnight, and it is evening: tonight began today
		return start, true
	case local.Before(end): // spans midnight, and it is early morning: it began yesterday
		return at(d-1, n.Start), true
	}
	return time.Time{}, false
}

// check refuses amount if the account's transfers since the night began (spent) would pass
// the cap with it.
func (n NightCap) check(now time.Time, spent, amount int64) error {
	if n.LimitCents <= 0 {
		return nil
	}
	// amount > limit-spent, not spent+amount > limit: the sum could overflow, the difference
	// cannot (both are non-negative).
	if _, night := n.nightOf(now); night && amount > n.LimitCents-spent {
		return &NightLimitError{LimitCents: n.LimitCents, RemainingCents: max(0, n.LimitCents-spent)}
	}
	return nil
}

// ErrNightLimitExceeded is wrapped by NightLimitError.
var ErrNightLimitExceeded = errors.New("night-time value cap exceeded")

// NightLimitError says how much an account may still send tonight.
type NightLimitError struct {
	LimitCents, RemainingCents int64
}

func (e *NightLimitError) Error() string {
	return fmt.Sprintf("this transfer would pass the night-time cap of %s per night: %s left tonight",
		BRL(e.LimitCents), BRL(e.RemainingCents))
}

func (e *NightLimitError) Unwrap() error { return ErrNightLimitExceeded }

// BRL formats cents as Brazilian reais: R$ 1.000,00.
func BRL(cents int64) string {
	sign := ""
	if cents < 0 {
		sign, cents = "-", -cents
	}
	whole := fmt.Sprint(cents / 100)
	for i := len(whole) - 3; i > 0; i -= 3 {
		whole = whole[:i] + "." + whole[i:]
	}
	return fmt.Sprintf("%sR$ %s,%02d", sign, whole, cents%100)
}

// Option configures a ledger.
type Option func(*options)

type options struct {
	rules Rules
	now   func() time.Time
	// clockSet: WithClock replaced time.Now, and the PostgreSQL ledger reads its clock from
	// now rather than from the database's (PostgresLedger.Now).
	clockSet bool
	// tokensLive: WithTokenLifetime's (zero: removals are kept and read forever).
	tokensLive time.Duration
}

// WithNightCap enforces n in every transfer (between persons): Rules with this night cap and
// no other rule.
func WithNightCap(n NightCap) Option { return func(o *options) { o.rules.Night = n } }

// WithRules enforces r in every transfer.
func WithRules(r Rules) Option { return func(o *options) { o.rules = r } }

// WithClock replaces time.Now: the one clock the ledger stamps and caps transfers with (tests
// set the hour they need).
func WithClock(now func() time.Time) Option {
	return func(o *options) { o.now, o.clockSet = now, true }
}

// WithTokenLifetime says how long the tokens a removal refuses live at most (the longer of
// TOKEN_TTL and DEVICE_TTL): a device's removal older than that, and a margin for the replicas'
// clocks (removalMargin), refuses nothing, so the PostgreSQL ledger deletes it and no replica
// reads it again. Without it, every removal ever made is read on each reload of the tier
// table, by every replica, and past some hundred thousand the reload outlasts its deadline and
// the replicas keep a stale table.
func WithTokenLifetime(d time.Duration) Option {
	return func(o *options) { o.tokensLive = d + removalMargin }
}

// removalMargin keeps a removal past the token lifetime for the replicas whose clocks, which
// check a token's expiry, run behind the database's, which stamped the removal.
const removalMargin = 5 * time.Minute

func newOptions(opts []Option) options {
	o := options{now: time.Now}
	for _, opt := range opts {
		opt(&o)
	}
	return o
}
