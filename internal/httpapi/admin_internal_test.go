package httpapi

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pixlimit/pixlimit/internal/pix"
)

// TestTheDeskSummarizesCallsWithoutTheToken: 25 calls without the right token from one IP and 3
// from another, in one period (a minute in production; an hour here, so that no timer fires
// during the test: the test flushes as the period's end would), are two audit records, written
// when the period ends, each counting its calls and naming its IP by the keyed name it was given.
func TestTheDeskSummarizesCallsWithoutTheToken(t *testing.T) {
	t.Parallel()
	ledger, err := pix.NewMemoryLedger(nil)
	if err != nil {
		t.Fatal(err)
	}
	r := newRefusals(ledger, slog.New(slog.DiscardHandler))
	r.every = time.Hour
	for i := range 28 {
		ip, status := "ip:aaaa", 401
		if i >= 25 {
			ip = "ip:bbbb"
		}
		if i >= 10 && i < 25 {
			status = 429 // past admin-ip's limit
		}
		r.count(ip, "GET /admin/v1/tiers", status)
	}
	if trail, _ := ledger.AuditTrail(context.Background(), 10); len(trail) != 0 {
		t.Fatalf("%d records before the period ended, want none: a row per call", len(trail))
	}
	r.flush("ip:aaaa")
	r.flush("ip:bbbb")
	trail, _ := ledger.AuditTrail(context.Background(), 10)
	got := map[string]pix.AuditRecord{}
	for _, rec := range trail {
		got[rec.Key] = rec
	}
	for ip, want := range map[string]struct{ calls, status int }{"ip:aaaa": {25, 429}, "ip:bbbb": {3, 401}} {
		rec := got[ip]
		if rec.Calls != want.calls || rec.Status != want.status || rec.Outcome != pix.OutcomeRefused || rec.Actor != "unauthenticated" {
			t.Errorf("%s's summary: %+v, want %d calls, status %d, refused", ip, rec, want.calls, want.status)
		}
	}
	if len(trail) != 2 {
		t.Errorf("%d records, want 2: one per IP", len(trail))
	}
}

// TestADeskThatClosesWritesItsOpenSummaries: a replica that stops within the minute writes the
// summaries the minute's end would have (they were lost: only a timer wrote them), and a call
// refused while it closes is written at once.
func TestADeskThatClosesWritesItsOpenSummaries(t *testing.T) {
	t.Parallel()
	ledger, err := pix.NewMemoryLedger(nil)
	if err != nil {
		t.Fatal(err)
	}
	r := newRefusals(ledger, slog.New(slog.DiscardHandler))
	r.every = time.Hour // no timer fires during the test
	for range 3 {
		r.count("ip:aaaa", "GET /admin/v1/tiers", 401)
	}
	r.close()
	r.count("ip:bbbb", "GET /admin/v1/tiers", 401)
	trail, _ := ledger.AuditTrail(context.Background(), 10)
	got := map[string]int{}
	for _, rec := range trail {
		got[rec.Key] += rec.Calls
	}
	if got["ip:aaaa"] != 3 || got["ip:bbbb"] != 1 || len(trail) != 2 {
		t.Errorf("written on close: %v in %d records, want ip:aaaa 3 and ip:bbbb 1 in 2", got, len(trail))
	}
}

// stalledAudit is an audit log that answers no call before its deadline.
type stalledAudit struct {
	pix.AuditLog
	calls atomic.Int32
}

func (s *stalledAudit) Audit(ctx context.Context, _ pix.AuditRecord) error {
	s.calls.Add(1)
	<-ctx.Done()
	return ctx.Err()
}

// TestADeskThatClosesOnAStalledLedgerGivesUp: when the ledger does not answer, a closing desk
// stops at its deadline: one write tried, and the summaries left logged in one line as not
// stored, not one error per IP.
func TestADeskThatClosesOnAStalledLedgerGivesUp(t *testing.T) {
	t.Parallel()
	ledger := &stalledAudit{}
	var logs bytes.Buffer // written by close, on this goroutine
	r := newRefusals(ledger, slog.New(slog.NewTextHandler(&logs, nil)))
	r.every = time.Hour
	for _, ip := range []string{"ip:a", "ip:b", "ip:c"} {
		r.count(ip, "GET /admin/v1/tiers", 401)
	}
	r.close()
	if n := ledger.calls.Load(); n != 1 {
		t.Errorf("%d writes tried, want 1: the rest given up at the deadline", n)
	}
	if got := strings.Count(logs.String(), "the desk closed"); got != 1 || !strings.Contains(logs.String(), "ips=2 calls=2") {
		t.Errorf("the log:\n%s\nwant one line giving up 2 IPs' 2 calls", logs.String())
	}
}
