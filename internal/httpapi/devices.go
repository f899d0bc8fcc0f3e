package httpapi

import (
	"net/http"
	"regexp"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/pixlimit/pixlimit/internal/auth"
	"github.com/pixlimit/pixlimit/internal/enforce"
	"github.com/pixlimit/pixlimit/internal/pix"
	"github.com/pixlimit/pixlimit/internal/ratelimit"
)

// The devices of an account, registered for PIX under the central bank's new-device rule: a
// device not registered sends under the new-device caps. A phished password must not register
// the phisher's phone: only the account's first registered device ever registers at once; once
// the account has had one (even if the support desk revoked them all), a new one waits
// DEVICE_REGISTRATION_DELAY (24 h) and then registers by itself, unless a registered device or the
// support desk approves it first, or the owner, seeing it pending in GET /v1/devices, removes it.

// deviceBody is a device as the routes show it.
type deviceBody struct {
	DeviceID     string     `json:"device_id"`
	Registered   bool       `json:"registered"`
	PendingUntil *time.Time `json:"pending_until"`
	Current      bool       `json:"current"`
}

func toDeviceBody(d pix.DeviceRegistration, current string) deviceBody {
	b := deviceBody{DeviceID: d.DeviceID, Registered: d.Registered, Current: d.DeviceID == current}
	if !d.PendingUntil.IsZero() {
		at := d.PendingUntil.UTC()
		b.PendingUntil = &at
	}
	return b
}

// registrar is what registering a device needs of the ledger: the accounts, whose password it
// checks, and their devices.
type registrar interface {
	pix.Payments
	pix.DeviceStore
}

// handleRegisterDevice asks to register the login's device for PIX once the account's password
// is given again, standing in for the strong authentication the rule requires: 200 registered
// (the account's first device, or DEVICE_REGISTRATION_DELAY 0), or 202 pending until a time.
// Each attempt counts against its access token's own key (login-device, keyed by the token's
// id), before the password is checked: a token stolen without the password buys that key's few
// guesses and no more, since another token needs a login, and the owner, logging in again, has a
// key of her own. It counts against the route's (account-settings) too, once its body is valid,
// the two in one decision when they share an algorithm and a shadow mode (by default): a request
// either refuses is recorded by neither. Its answer's RateLimit headers are account-settings'
// unless login-device refuses it.
func handleRegisterDevice(limiter limiter, limits enforce.RouteLimits, ledger registrar, passwords *auth.Passwords, delay time.Duration) echo.HandlerFunc {
	type request struct {
		Password string `json:"password"`
	}
	type response struct {
		DeviceID     string     `json:"device_id"`
		Registered   bool       `json:"registered"`
		PendingUntil *time.Time `json:"pending_until,omitempty"`
	}
	guesses := &report{show: func(d ratelimit.Decision) ratelimit.Decision {
		if d.Allowed {
			d.Results = nil // the route's headers stay
		}
		return d
	}}
	// Decided together, the route's headers when admitted, the refusing key's when refused.
	both := &report{show: func(d ratelimit.Decision) ratelimit.Decision {
		if d.Allowed {
			return first(d)
		}
		return ratelimit.Decision{Worst: d.Worst, Results: []ratelimit.Result{d.Worst}}
	}}
	together := validateTogether(limits.Settings, limits.LoginDevice) == nil // one algorithm and shadow mode
	return func(c echo.Context) error {
		s, err := auth.SubjectOf(c)
		if err != nil {
			return err
		}
		if s.Device == "" {
			return auth.ErrUnauthorized // a token from before devices were named: log in again
		}
		var req request
		if err := decodeJSON(c, &req); err != nil {
			return err
		}
		if req.Password == "" || len(req.Password) > 72 {
			return invalid("invalid device registration", map[string]string{"password": "required, at most 72 bytes"})
		}
		device, err := accountDevice(c)
		if err != nil {
			return err
		}
		// A guess (login-device), not a malformed body; one decision with the route's key, so that a
		// request either key refuses is recorded by neither.
		settings, guess := checkOf(limits.Settings, device), checkOf(limits.LoginDevice, "token:"+s.ID)
		if together {
			err = limiter.enforce(c, both, settings, guess)
		} else if err = limiter.enforce(c, nil, settings); err == nil {
			// Two calls, their algorithms or shadow modes differing: a guess refused here leaves
			// the settings' admission spent.
			err = limiter.enforce(c, guesses, guess)
		}
		if err != nil {
			return err
		}
		acct, err := ledger.Account(c.Request().Context(), s.Account)
		if err != nil {
			return err
		}
		// The bearer of an access token: a device that logged in, before a stranger's login.
		if _, err := passwords.Check(c.Request().Context(), ledger, acct.Document, req.Password, auth.Trusted); err != nil {
			return err
		}
		reg, err := ledger.RegisterDevice(c.Request().Context(), s.Account, s.Device, delay)
		if err != nil {
			return err
		}
		b := toDeviceBody(reg, "")
		status := http.StatusOK
		if !reg.Registered {
			status = http.StatusAccepted
		}
		return c.JSON(status, response{DeviceID: b.DeviceID, Registered: b.Registered, PendingUntil: b.PendingUntil})
	}
}

// handleDevices lists the account's registered and pending devices, the current one marked.
func handleDevices(ledger pix.DeviceStore) echo.HandlerFunc {
	type response struct {
		Devices []deviceBody `json:"devices"`
	}
	return func(c echo.Context) error {
		s, err := auth.SubjectOf(c)
		if err != nil {
			return err
		}
		list, err := ledger.Devices(c.Request().Context(), s.Account)
		if err != nil {
			return err
		}
		out := response{Devices: []deviceBody{}}
		for _, d := range list {
			b := toDeviceBody(d, s.Device)
			b.Current = d.DeviceID == s.Device
			out.Devices = append(out.Devices, b)
		}
		return c.JSON(http.StatusOK, out)
	}
}

// deviceParam is a device id as a route names it.
var deviceParam = regexp.MustCompile(`^[A-Za-z0-9]{1,64}$`)

// deviceCall is the subject of a call on the device its path names, and that device's id.
func deviceCall(c echo.Context) (auth.Subject, string, error) {
	s, err := auth.SubjectOf(c)
	if err != nil {
		return s, "", err
	}
	device := c.Param("device_id")
	if !deviceParam.MatchString(device) {
		return s, "", invalid("invalid device id", map[string]string{"device_id": "1 to 64 letters and digits"})
	}
	return s, device, nil
}

// handleApproveDevice registers a pending device at once, from a registered one (else 403
// device_not_registered).
func handleApproveDevice(ledger pix.DeviceStore) echo.HandlerFunc {
	return func(c echo.Context) error {
		s, device, err := deviceCall(c)
		if err != nil {
			return err
		}
		if err := ledger.ApproveDevice(c.Request().Context(), s.Account, s.Device, device); err != nil {
			return err
		}
		return c.JSON(http.StatusOK, deviceBody{DeviceID: device, Registered: true, Current: device == s.Device})
	}
}

// handleRemoveDevice cancels a pending registration or unregisters a device; its access tokens
// are then refused (401) on every replica within the tier table's polling interval. A device
// not registered may remove only itself (403 device_not_registered). It counts against
// account-settings, per account and device: a flood from another device never uses up the
// owner's, and the desk can always revoke.
func handleRemoveDevice(ledger pix.DeviceStore, tiers *pix.Tiers) echo.HandlerFunc {
	return func(c echo.Context) error {
		s, device, err := deviceCall(c)
		if err != nil {
			return err
		}
		if err := ledger.RemoveDevice(c.Request().Context(), s.Account, s.Device, device); err != nil {
			return err
		}
		if tiers != nil {
			_ = tiers.Refresh(c.Request().Context()) // this replica at once; the others poll
		}
		return c.NoContent(http.StatusNoContent)
	}
}
