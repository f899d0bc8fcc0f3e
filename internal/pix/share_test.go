package pix

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestShareHoldsAnAccountToItsPlaces: with 2 places, an account's third call waits, then is
// ErrLedgerBusy when none frees within the wait, or gets the place a finished call gave back;
// another account is never held back; a call made under a Hold takes no second place.
func TestShareHoldsAnAccountToItsPlaces(t *testing.T) {
	s, err := NewShare(2, 50*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	_, first, err := s.Hold(ctx, "acct-ana", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	held, second, err := s.Hold(ctx, "acct-ana", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Hold(ctx, "acct-ana", time.Hour); !errors.Is(err, ErrLedgerBusy) {
		t.Fatalf("Ana's third call while two are in progress: %v, want ErrLedgerBusy after the wait", err)
	}
	if _, _, err := s.Hold(ctx, "acct-ana", 0); !errors.Is(err, ErrLedgerBusy) {
		t.Fatalf("Ana's third call with nothing left of its deadline: %v, want ErrLedgerBusy at once", err)
	}
	left, cancel := context.WithCancel(ctx)
	cancel()
	if _, _, err := s.Hold(left, "acct-ana", time.Hour); !errors.Is(err, context.Canceled) || errors.Is(err, ErrLedgerBusy) {
		t.Fatalf("Ana's third call from a client that left: %v, want context.Canceled (499), not ledger_busy", err)
	}
	if _, release, err := s.Hold(ctx, "acct-diego", time.Hour); err != nil {
		t.Fatalf("Diego's call while Ana holds her share: %v", err)
	} else {
		release()
	}
	if again, release, err := s.Hold(held, "acct-ana", time.Hour); err != nil || again != held {
		t.Fatalf("a call under Ana's hold: %v, want it to take no place of its own", err)
	} else {
		release()
	}
	got := make(chan error)
	go func() {
		_, release, err := s.Hold(ctx, "acct-ana", time.Hour)
		if err == nil {
			release()
		}
		got <- err
	}()
	first() // gives its place to the waiter
	if err := <-got; err != nil {
		t.Errorf("a waiter when a place frees: %v", err)
	}
	second()
	if n := len(s.held); n != 0 {
		t.Errorf("%d accounts kept after their calls ended, want none", n)
	}
}

// TestSharedCountsTheCustomersCallsOnly: a ledger call of an account under Shared takes one of
// its places (busy when both are held), while the desk's calls are never held back.
func TestSharedCountsTheCustomersCallsOnly(t *testing.T) {
	mem, err := NewMemoryLedger(demo())
	if err != nil {
		t.Fatal(err)
	}
	s, _ := NewShare(2, 20*time.Millisecond)
	l := Shared(mem, s)
	ctx := context.Background()
	for range 2 {
		if _, _, err := s.Hold(ctx, "acct-ana", time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := l.Statement(ctx, "acct-ana", 1); !errors.Is(err, ErrLedgerBusy) {
		t.Errorf("Ana's statement while she holds both places: %v, want ErrLedgerBusy", err)
	}
	if _, err := l.Statement(ctx, "acct-bruno", 1); err != nil {
		t.Errorf("Bruno's statement: %v", err)
	}
	if _, err := l.RevokeDevices(ctx, "acct-ana"); err != nil {
		t.Errorf("the desk's revocation of Ana's devices: %v, want it never held back", err)
	}
}
