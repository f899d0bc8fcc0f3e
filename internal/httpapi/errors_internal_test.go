package httpapi

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/pixlimit/pixlimit/internal/auth"
	"github.com/pixlimit/pixlimit/internal/pix"
)

// TestBusyIsA503WithRetryAfter: what is shed on purpose (a login that found every password
// comparison in use, a call past the account's share of the ledger) is a 503 its client may
// retry a second later, whatever wraps it.
func TestBusyIsA503WithRetryAfter(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code Code
	}{
		{fmt.Errorf("login: %w", auth.ErrBusy), CodeLoginBusy},
		{fmt.Errorf("statement: %w", pix.ErrLedgerBusy), CodeLedgerBusy},
	} {
		e := toError(tc.err, 5*time.Second)
		if e.Code != tc.code || e.status() != http.StatusServiceUnavailable || e.RetryAfter != time.Second {
			t.Errorf("%v: %s %d Retry-After %v, want %s 503 Retry-After 1s", tc.err, e.Code, e.status(), e.RetryAfter, tc.code)
		}
	}
}
