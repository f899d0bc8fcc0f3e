package outages

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/pixlimit/pixlimit/internal/ratelimit"
	"github.com/pixlimit/pixlimit/internal/testing/apitest"
)

// decider answers every decision by err: nil, or unavailable. Its decisions are refused from
// memory when denyCached is set. The Log under test only reads what a Decider answers, so this
// stands for any: what a real Redis outage looks like to the HTTP layer is tested there.
type decider struct {
	err        error
	denyCached bool
}

func (d *decider) AllowAll(_ context.Context, checks ...ratelimit.Check) (ratelimit.Decision, error) {
	if d.err != nil {
		return ratelimit.Decision{}, d.err
	}
	return ratelimit.Decision{Allowed: !d.denyCached, DenyCached: d.denyCached}, nil
}

// Decide runs the first step and fails the second when err is set, as a Limiter deciding each
// step apart does when Redis goes away between them.
func (d *decider) Decide(_ context.Context, steps ...ratelimit.Step) (ratelimit.Decisions, error) {
	if d.err != nil {
		return ratelimit.DecisionsOf(steps, ratelimit.Decision{Allowed: true}), d.err
	}
	return ratelimit.DecisionsOf(steps, make([]ratelimit.Decision, len(steps))...), nil
}

func newLog(next ratelimit.Decider, now *time.Time) (*Log, *apitest.Logs) {
	var logs apitest.Logs
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		},
	}))
	return New(next, Options{Logger: logger, Every: 10 * time.Second, Now: func() time.Time { return *now }}), &logs
}

func lines(logs *apitest.Logs) string { return strings.TrimSpace(logs.String()) }

// TestAnOutageIsLoggedAsItWasSeen: a policy that fails for 2 s, then is not used for a minute,
// reports a 2 s outage, and the minute apart, not a 62 s outage; the failures within the interval
// are held back and counted.
func TestAnOutageIsLoggedAsItWasSeen(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	next := &decider{err: fmt.Errorf("%w: dial tcp: connection refused", ratelimit.ErrUnavailable)}
	o, logs := newLog(next, &now)
	pix := ratelimit.Check{Policy: ratelimit.Policy{Name: "pix"}, Identity: "ana"}
	ctx := context.Background()

	_, _ = o.AllowAll(ctx, pix)
	now = now.Add(time.Second)
	_, _ = o.AllowAll(ctx, pix) // within the interval: held back
	now = now.Add(time.Second)
	_, _ = o.AllowAll(ctx, pix)
	now = now.Add(time.Minute) // Redis came back; nobody paid for a minute
	next.err = nil
	_, _ = o.AllowAll(ctx, pix)
	_, _ = o.AllowAll(ctx, pix) // once

	got := lines(logs)
	want := `level=ERROR msg="rate limiter unavailable" policy=pix cause="rate limiter unavailable: dial tcp: connection refused" outage=0s held_back=0
level=INFO msg="rate limiter recovered" policy=pix outage=2s last_failure_ago=1m0s held_back=2`
	if got != want {
		t.Errorf("logged:\n%s\nwant:\n%s", got, want)
	}
}

// TestAnOutageEndsWhenRedisAnswers: a policy that failed once, then was not used while another
// policy's decisions reached Redis, fails again 8 minutes later: two outages of 0 s, the first
// ended when Redis answered the other, not one of 8 minutes.
func TestAnOutageEndsWhenRedisAnswers(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	next := &decider{err: fmt.Errorf("%w: i/o timeout", ratelimit.ErrUnavailable)}
	o, logs := newLog(next, &now)
	statement := ratelimit.Check{Policy: ratelimit.Policy{Name: "statement"}, Identity: "ana"}
	pix := ratelimit.Check{Policy: ratelimit.Policy{Name: "pix"}, Identity: "ana"}
	ctx := context.Background()

	_, _ = o.AllowAll(ctx, statement)
	now = now.Add(2 * time.Second)
	next.err = nil
	_, _ = o.AllowAll(ctx, pix) // Redis answers
	now = now.Add(8 * time.Minute)
	next.err = fmt.Errorf("%w: i/o timeout", ratelimit.ErrUnavailable)
	_, _ = o.AllowAll(ctx, statement)

	got := lines(logs)
	want := `level=ERROR msg="rate limiter unavailable" policy=statement cause="rate limiter unavailable: i/o timeout" outage=0s held_back=0
level=INFO msg="rate limiter recovered" policy=statement outage=0s last_failure_ago=2s held_back=0
level=ERROR msg="rate limiter unavailable" policy=statement cause="rate limiter unavailable: i/o timeout" outage=0s held_back=0`
	if got != want {
		t.Errorf("logged:\n%s\nwant:\n%s", got, want)
	}
}

// TestAPolicyFailingAmongOthersStaysInItsOutage: a policy whose decisions fail while another's
// pass (long sequences timing out, short ones not) is in one outage, reported once per
// interval, not ended and begun again at each failure.
func TestAPolicyFailingAmongOthersStaysInItsOutage(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	failing, passing := &decider{err: fmt.Errorf("%w: i/o timeout", ratelimit.ErrUnavailable)}, &decider{}
	o, logs := newLog(failing, &now)
	pix := ratelimit.Check{Policy: ratelimit.Policy{Name: "pix"}, Identity: "ana"}
	statement := ratelimit.Check{Policy: ratelimit.Policy{Name: "statement"}, Identity: "ana"}
	ctx := context.Background()
	for range 5 {
		o.next = failing
		_, _ = o.AllowAll(ctx, pix)
		o.next = passing
		_, _ = o.AllowAll(ctx, statement)
		now = now.Add(time.Second)
	}
	if got, want := lines(logs), `level=ERROR msg="rate limiter unavailable" policy=pix cause="rate limiter unavailable: i/o timeout" outage=0s held_back=0`; got != want {
		t.Errorf("logged:\n%s\nwant:\n%s", got, want)
	}
}

// TestWhatIsNoOutageOrNoRecovery: a client that left (its context done) is no outage, an error
// that is not ErrUnavailable neither, and a refusal from memory during an outage is no recovery.
func TestWhatIsNoOutageOrNoRecovery(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	pix := ratelimit.Check{Policy: ratelimit.Policy{Name: "pix"}, Identity: "ana"}

	left, cancel := context.WithCancel(context.Background())
	cancel()
	o, logs := newLog(&decider{err: fmt.Errorf("%w: %w", ratelimit.ErrUnavailable, context.Canceled)}, &now)
	_, _ = o.AllowAll(left, pix)
	o.next = &decider{err: errors.New("ratelimit: no checks")}
	_, _ = o.AllowAll(context.Background(), pix)
	if got := lines(logs); got != "" {
		t.Errorf("a client that left, or a caller's mistake, logged:\n%s", got)
	}

	next := &decider{err: ratelimit.ErrUnavailable}
	o, logs = newLog(next, &now)
	_, _ = o.AllowAll(context.Background(), pix)
	next.err, next.denyCached = nil, true
	_, _ = o.AllowAll(context.Background(), pix)
	if got := lines(logs); strings.Contains(got, "recovered") {
		t.Errorf("a refusal from memory was taken for a recovery:\n%s", got)
	}
	next.denyCached = false
	_, _ = o.AllowAll(context.Background(), pix)
	if got := lines(logs); !strings.Contains(got, `msg="rate limiter recovered" policy=pix`) {
		t.Errorf("a decision of Redis's after the outage: no recovery logged:\n%s", got)
	}
}

// TestDecideReportsEachStep: the steps that ran decided; the one that failed and those after it
// could not be decided, each policy reported.
func TestDecideReportsEachStep(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	check := func(name string) ratelimit.Check {
		return ratelimit.Check{Policy: ratelimit.Policy{Name: name}, Identity: "ana"}
	}
	next := &decider{err: ratelimit.ErrUnavailable}
	o, logs := newLog(next, &now)
	_, _ = o.Decide(context.Background(), ratelimit.AskStep(check("first")), ratelimit.AllowStep(check("second")), ratelimit.AllowStep(check("third")))
	got := lines(logs)
	for name, want := range map[string]bool{"first": false, "second": true, "third": true} {
		if logged := strings.Contains(got, "policy="+name+" "); logged != want {
			t.Errorf("policy %s reported unavailable: %v, want %v:\n%s", name, logged, want, got)
		}
	}
}
