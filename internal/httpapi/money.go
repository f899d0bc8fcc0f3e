package httpapi

import (
	"errors"
	"fmt"
	"maps"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/pixlimit/pixlimit/internal/auth"
	"github.com/pixlimit/pixlimit/internal/enforce"
	"github.com/pixlimit/pixlimit/internal/pix"
)

// limitsBody is GET /v1/limits's answer: the account's money limits in force and the increases
// it asked for that are not yet (pix.Rules: lower at once, higher after LIMIT_INCREASE_DELAY).
type limitsBody struct {
	NightLimitCents int64         `json:"night_limit_cents"`
	DayLimitCents   int64         `json:"day_limit_cents"`
	NightStart      string        `json:"night_start"`
	Pending         []pendingBody `json:"pending"`
}

// pendingBody is one pending increase: value_cents for a limit, value for the night's start.
type pendingBody struct {
	Field       string    `json:"field"`
	ValueCents  *int64    `json:"value_cents,omitempty"`
	Value       string    `json:"value,omitempty"`
	EffectiveAt time.Time `json:"effective_at"`
}

func toLimitsBody(l pix.MoneyLimits) limitsBody {
	b := limitsBody{NightLimitCents: l.NightLimitCents, DayLimitCents: l.DayLimitCents, NightStart: clock(l.NightStart),
		Pending: []pendingBody{}}
	for _, p := range l.Pending {
		pb := pendingBody{Field: p.Field, EffectiveAt: p.EffectiveAt.UTC()}
		if p.Field == pix.FieldNightStart {
			pb.Value = clock(time.Duration(p.Value))
		} else {
			v := p.Value
			pb.ValueCents = &v
		}
		b.Pending = append(b.Pending, pb)
	}
	return b
}

// clock is a time of day as HH:MM.
func clock(d time.Duration) string {
	return fmt.Sprintf("%02d:%02d", int(d/time.Hour), int(d%time.Hour/time.Minute))
}

// handleGetLimits shows the account's money limits.
func handleGetLimits(ledger pix.MoneyLimitStore) echo.HandlerFunc {
	return func(c echo.Context) error {
		id, err := auth.AccountID(c)
		if err != nil {
			return err
		}
		l, err := ledger.Limits(c.Request().Context(), id)
		if err != nil {
			return err
		}
		return c.JSON(http.StatusOK, toLimitsBody(l))
	}
}

// handlePutLimits changes any of the account's limits: a lower value at once, a higher one
// pending until its effective_at (the answer shows which). Invalid values are 400 naming each
// field, and nothing changes. It counts against settings (account-settings) once the body is
// valid, a lowering like a raise: the bucket is per account and device, so a flood from one
// device (a thief's) never uses up the owner's own device's bucket, and the desk can always act.
// Exempting the lowering protected no one and let one device hold the ledger's row locks.
func handlePutLimits(ledger pix.MoneyLimitStore, limiter limiter, settings enforce.RouteLimit) echo.HandlerFunc {
	type request struct {
		NightLimitCents *int64  `json:"night_limit_cents"`
		DayLimitCents   *int64  `json:"day_limit_cents"`
		NightStart      *string `json:"night_start"`
	}
	return func(c echo.Context) error {
		id, err := auth.AccountID(c)
		if err != nil {
			return err
		}
		var req request
		if err := decodeJSON(c, &req); err != nil {
			return err
		}
		change := pix.MoneyLimitsChange{NightLimitCents: req.NightLimitCents, DayLimitCents: req.DayLimitCents}
		fields := map[string]string{} // every bad value named, not the first
		if req.NightStart != nil {
			switch *req.NightStart {
			case "20:00", "22:00":
				d := 20 * time.Hour
				if *req.NightStart == "22:00" {
					d = 22 * time.Hour
				}
				change.NightStart = &d
			default:
				fields[pix.FieldNightStart] = `must be "20:00" or "22:00"`
			}
		}
		var le *pix.MoneyLimitsError
		if err := change.Valid(); errors.As(err, &le) { // a 400 costs no quota; the ledger checks again
			maps.Copy(fields, le.Fields)
		}
		if len(fields) > 0 {
			return invalid("invalid limits", fields)
		}
		if change.NightLimitCents == nil && change.DayLimitCents == nil && change.NightStart == nil {
			return invalid("nothing to change", map[string]string{"body": "give night_limit_cents, day_limit_cents or night_start"})
		}
		device, err := accountDevice(c)
		if err != nil {
			return err
		}
		if err := limiter.enforce(c, nil, checkOf(settings, device)); err != nil {
			return err
		}
		l, err := ledger.SetLimits(c.Request().Context(), id, change)
		if errors.As(err, &le) {
			return invalid("invalid limits", le.Fields)
		}
		if err != nil {
			return err
		}
		return c.JSON(http.StatusOK, toLimitsBody(l))
	}
}

// handleCancelPending drops the account's pending increases.
func handleCancelPending(ledger pix.MoneyLimitStore) echo.HandlerFunc {
	return func(c echo.Context) error {
		id, err := auth.AccountID(c)
		if err != nil {
			return err
		}
		l, err := ledger.CancelPendingLimits(c.Request().Context(), id)
		if err != nil {
			return err
		}
		return c.JSON(http.StatusOK, toLimitsBody(l))
	}
}
