package httpapi

import (
	"errors"
	"testing"

	"github.com/pixlimit/pixlimit/internal/ratelimit"
)

// TestASequenceStepIsWhatRan: a step that ran is answered by its decision even when a later step
// failed (a cluster runs steps one call each); a step that did not run is answered by the
// sequence's error, or, after an earlier refusal that its route let through, by an
// ErrUnavailable, so that its fail mode answers: never a 500.
func TestASequenceStepIsWhatRan(t *testing.T) {
	t.Parallel()
	down := errors.New("the third node did not answer")
	ran := ratelimit.Decision{Allowed: true}
	for _, tt := range []struct {
		name    string
		d       ratelimit.Decision
		ran     bool
		err     error
		want    ratelimit.Decision
		wantErr error
	}{
		{"ran, then a later step failed", ran, true, down, ran, nil},
		{"failed", ratelimit.Decision{}, false, down, ratelimit.Decision{}, down},
		{"after a refusal", ratelimit.Decision{}, false, nil, ratelimit.Decision{}, ratelimit.ErrUnavailable},
	} {
		got, err := whatRan(tt.d, tt.ran, tt.err, 1)
		if got.Allowed != tt.want.Allowed || !errors.Is(err, tt.wantErr) || (tt.wantErr == nil) != (err == nil) {
			t.Errorf("%s: %+v, %v; want %+v, %v", tt.name, got, err, tt.want, tt.wantErr)
		}
	}
}
