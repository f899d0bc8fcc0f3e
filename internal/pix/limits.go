package pix

import (
	"errors"
	"fmt"
	"time"
)

// Rules are the bank's limits on the money a transfer may move, as the central bank writes
// them. Each is a limit on money, enforced inside the transfer's transaction under the payer's
// lock, beside the balance it protects, never in Redis: concurrent transfers can never sum past
// one, and a limit never forgets what was sent.
//
//   - The night cap (NightCap; Resolução BCB nº 142/2021) applies to payments between
//     distinct natural persons only, PF to PF: a payment by or to a company is outside it. The
//     payer's night starts at the bank's NightCap.Start or, at the customer's choice, at 20:00 or
//     22:00 (Instrução Normativa BCB nº 185/2021), and ends at NightCap.End.
//   - A day limit (DayLimitCents) over every transfer of a São Paulo calendar day.
//   - Limits the customer sets (Res. BCB 142/2021): lowered at once, raised only IncreaseDelay
//     after the request (24 hours by default; the rule asks 24 to 48), so that a fraudster
//     holding the phone for an evening cannot raise a limit and empty the account.
//   - New devices (the central bank's rule of July 2024, in force since 1 November 2024): a
//     device not registered for PIX under the customer's strong authentication may send at most
//     NewDeviceTransferCents per transfer and NewDeviceDayCents per day in all.
//
// A zero limit of the bank's switches its rule off.
type Rules struct {
	// Night is the night cap's default: the limit, the night's start and end, and the time
	// zone of every day and night.
	Night NightCap
	// DayLimitCents is the bank's default day limit per account; 0: none.
	DayLimitCents int64
	// NewDeviceTransferCents and NewDeviceDayCents cap what devices not registered for PIX may
	// send, per transfer and per day in all; 0 switches either off.
	NewDeviceTransferCents, NewDeviceDayCents int64
	// IncreaseDelay is how long after a customer's request a higher limit takes effect.
	IncreaseDelay time.Duration
}

// MaxLimitCents is the highest night or day limit a customer may set: R$ 1.000.000,00.
const MaxLimitCents = 100_000_000

// NightStarts are the night's starts a customer may choose (Instrução Normativa BCB 185/2021).
var NightStarts = []time.Duration{20 * time.Hour, 22 * time.Hour}

// Limit fields, as GET /v1/limits names them.
const (
	FieldNightLimit = "night_limit_cents"
	FieldDayLimit   = "day_limit_cents"
	FieldNightStart = "night_start"
)

// MoneyLimits are an account's money limits in force and the increases it asked for that are not yet.
type MoneyLimits struct {
	// NightLimitCents is the most the account may send tonight to other persons; 0: no cap.
	NightLimitCents int64
	// DayLimitCents is the most it may send in a day; 0: no limit.
	DayLimitCents int64
	// NightStart is when its night starts, since midnight.
	NightStart time.Duration
	// Pending are the requested increases, at most one per field, each with when it applies.
	Pending []PendingLimit
}

// PendingLimit is a requested increase of one field: Value is cents, or for FieldNightStart a
// time since midnight in nanoseconds.
type PendingLimit struct {
	Field       string
	Value       int64
	EffectiveAt time.Time
}

// MoneyLimitsChange asks to change any of an account's limits; nil fields stay as they are.
type MoneyLimitsChange struct {
	NightLimitCents, DayLimitCents *int64
	NightStart                     *time.Duration
}

// ErrInvalidLimits is wrapped by the error of a change that asks for a value no customer may set.
var ErrInvalidLimits = errors.New("invalid limits")

// accountLimits is what an account set: nil fields are the bank's defaults. Pending increases
// are kept by field.
type accountLimits struct {
	night, day *int64
	start      *time.Duration
	pending    map[string]PendingLimit
}

// settle applies the pending increases due at now: what the ledger does when it reads an
// account's limits, so an increase applies from its effective time, never earlier.
func (a accountLimits) settle(now time.Time) accountLimits {
	out := accountLimits{night: a.night, day: a.day, start: a.start, pending: map[string]PendingLimit{}}
	for f, p := range a.pending {
		if now.Before(p.EffectiveAt) {
			out.pending[f] = p
			continue
		}
		v := p.Value
		switch f {
		case FieldNightLimit:
			out.night = &v
		case FieldDayLimit:
			out.day = &v
		case FieldNightStart:
			d := time.Duration(v)
			out.start = &d
		}
	}
	return out
}

// inForce are the account's limits at now, over the bank's defaults.
func (r Rules) inForce(a accountLimits, now time.Time) MoneyLimits {
	a = a.settle(now)
	l := MoneyLimits{NightLimitCents: r.Night.LimitCents, DayLimitCents: r.DayLimitCents, NightStart: r.Night.Start}
	if a.night != nil {
		l.NightLimitCents = *a.night
	}
	if a.day != nil {
		l.DayLimitCents = *a.day
	}
	if a.start != nil {
		l.NightStart = *a.start
	}
	for _, f := range []string{FieldNightLimit, FieldDayLimit, FieldNightStart} {
		if p, ok := a.pending[f]; ok {
			l.Pending = append(l.Pending, p)
		}
	}
	return l
}

// change applies c to a at now: a value as strict as the one in force or stricter applies at
// once (and drops that field's pending increase); a looser one becomes the field's pending
// increase, effective IncreaseDelay from now (replacing an earlier request). A limit of 0 is
// none, the loosest; a later night start is a shorter night, looser.
func (r Rules) change(a accountLimits, c MoneyLimitsChange, now time.Time) (accountLimits, error) {
	if err := c.Valid(); err != nil {
		return a, err
	}
	a = a.settle(now)
	current := r.inForce(a, now)
	out := accountLimits{night: a.night, day: a.day, start: a.start, pending: map[string]PendingLimit{}}
	for f, p := range a.pending {
		out.pending[f] = p
	}
	apply := func(field string, stricter bool, value int64, set func()) {
		if stricter {
			set()
			delete(out.pending, field)
			return
		}
		out.pending[field] = PendingLimit{Field: field, Value: value, EffectiveAt: now.Add(r.IncreaseDelay)}
	}
	if v := c.NightLimitCents; v != nil {
		apply(FieldNightLimit, !looser(*v, current.NightLimitCents), *v, func() { out.night = v })
	}
	if v := c.DayLimitCents; v != nil {
		apply(FieldDayLimit, !looser(*v, current.DayLimitCents), *v, func() { out.day = v })
	}
	if v := c.NightStart; v != nil {
		apply(FieldNightStart, r.Night.length(*v) >= r.Night.length(current.NightStart), int64(*v), func() { out.start = v })
	}
	return out, nil
}

// looser reports whether limit v allows more than limit current (0 is no limit).
func looser(v, current int64) bool {
	switch {
	case current == 0:
		return false // nothing is looser than no limit
	case v == 0:
		return true
	}
	return v > current
}

// Valid checks a change's values, which need no account: limits from 0 to MaxLimitCents, a
// night start of NightStarts. The error, a *MoneyLimitsError, names each field.
func (c MoneyLimitsChange) Valid() error {
	fields := map[string]string{}
	for f, v := range map[string]*int64{FieldNightLimit: c.NightLimitCents, FieldDayLimit: c.DayLimitCents} {
		if v != nil && (*v < 0 || *v > MaxLimitCents) {
			fields[f] = fmt.Sprintf("must be from 0 (no limit) to %d (%s)", int64(MaxLimitCents), BRL(MaxLimitCents))
		}
	}
	if s := c.NightStart; s != nil && *s != NightStarts[0] && *s != NightStarts[1] {
		fields[FieldNightStart] = `must be "20:00" or "22:00"`
	}
	if len(fields) > 0 {
		return &MoneyLimitsError{Fields: fields}
	}
	return nil
}

// MoneyLimitsError names the fields of an invalid MoneyLimitsChange.
type MoneyLimitsError struct{ Fields map[string]string }

func (e *MoneyLimitsError) Error() string { return fmt.Sprintf("invalid limits: %v", e.Fields) }
func (e *MoneyLimitsError) Unwrap() error { return ErrInvalidLimits }

// sent is what an account sent in the periods its limits count: tonight to other persons, today
// in all, and today from devices not registered for PIX.
type sent struct{ night, day, unregistered int64 }

// transferFacts are what the rules need to know of a transfer beyond its amount.
type transferFacts struct {
	now              time.Time
	amount           int64
	betweenPersons   bool // PF to PF, distinct persons
	deviceRegistered bool
	limits           MoneyLimits // the payer's, in force at now
}

// periods are the starts of the periods a transfer at now counts in, for an account whose night
// starts at start: tonight (zero by day) and today, in the night cap's time zone.
func (r Rules) periods(now time.Time, start time.Duration) (night, day time.Time) {
	n := r.Night
	n.Start = start
	night, _ = n.nightOf(now)
	if loc := r.Night.Location; loc != nil {
		y, m, d := now.In(loc).Date()
		day = time.Date(y, m, d, 0, 0, 0, 0, loc)
	}
	return night, day
}

// check applies every rule to a transfer, given what the payer already sent: the device caps,
// the day limit, then the night cap. Differences, not sums, are compared: no sum can overflow.
func (r Rules) check(t transferFacts, s sent) error {
	if !t.deviceRegistered {
		if r.NewDeviceTransferCents > 0 && t.amount > r.NewDeviceTransferCents {
			return &DeviceLimitError{TransferCents: r.NewDeviceTransferCents, DayCents: r.NewDeviceDayCents,
				RemainingCents: r.deviceLeft(s), PerTransfer: true}
		}
		if r.NewDeviceDayCents > 0 && t.amount > r.NewDeviceDayCents-s.unregistered {
			return &DeviceLimitError{TransferCents: r.NewDeviceTransferCents, DayCents: r.NewDeviceDayCents, RemainingCents: r.deviceLeft(s)}
		}
	}
	if day := t.limits.DayLimitCents; day > 0 && t.amount > day-s.day {
		return &DayLimitError{LimitCents: day, RemainingCents: max(0, day-s.day)}
	}
	if !t.betweenPersons {
		return nil
	}
	// The limit in force: the customer's own, else the bank's default. NIGHT_LIMIT_CENTS=0
	// switches off only the default, never a limit a customer set.
	n := r.Night
	n.LimitCents, n.Start = t.limits.NightLimitCents, t.limits.NightStart
	return n.check(t.now, s.night, t.amount)
}

// deviceLeft is what unregistered devices may still send today.
func (r Rules) deviceLeft(s sent) int64 {
	if r.NewDeviceDayCents <= 0 {
		return r.NewDeviceTransferCents
	}
	left := max(0, r.NewDeviceDayCents-s.unregistered)
	if r.NewDeviceTransferCents > 0 {
		left = min(left, r.NewDeviceTransferCents)
	}
	return left
}

// length is how long a night starting at start lasts, until the cap's End.
func (n NightCap) length(start time.Duration) time.Duration {
	return ((n.End-start)%(24*time.Hour) + 24*time.Hour) % (24 * time.Hour)
}

// ErrDailyLimitExceeded is wrapped by DayLimitError.
var ErrDailyLimitExceeded = errors.New("day limit exceeded")

// DayLimitError says how much an account may still send today.
type DayLimitError struct{ LimitCents, RemainingCents int64 }

func (e *DayLimitError) Error() string {
	return fmt.Sprintf("this transfer would pass the day limit of %s: %s left today", BRL(e.LimitCents), BRL(e.RemainingCents))
}
func (e *DayLimitError) Unwrap() error { return ErrDailyLimitExceeded }

// Remaining is what is left today, in cents.
func (e *DayLimitError) Remaining() int64 { return e.RemainingCents }

// ErrDeviceLimitExceeded is wrapped by DeviceLimitError.
var ErrDeviceLimitExceeded = errors.New("new-device limit exceeded")

// DeviceLimitError says what a device not registered for PIX may still send, and how to register it.
type DeviceLimitError struct {
	TransferCents, DayCents, RemainingCents int64
	// PerTransfer says the transfer alone is above the per-transfer cap.
	PerTransfer bool
}

func (e *DeviceLimitError) Error() string {
	return fmt.Sprintf("this device is not registered for PIX: it may send at most %s per transfer and %s a day in all; "+
		"%s left for it today. Register it with POST /v1/devices/current/register and your password",
		BRL(e.TransferCents), BRL(e.DayCents), BRL(e.RemainingCents))
}
func (e *DeviceLimitError) Unwrap() error { return ErrDeviceLimitExceeded }

// Remaining is what this device may still send in one transfer today, in cents.
func (e *DeviceLimitError) Remaining() int64 { return e.RemainingCents }

// Remaining is what is left tonight, in cents.
func (e *NightLimitError) Remaining() int64 { return e.RemainingCents }
