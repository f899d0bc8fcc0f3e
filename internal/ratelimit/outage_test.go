package ratelimit

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestAnOutageIsLoggedAsItWasSeen: a policy that fails for 2 s, then is not used for a minute,
// reports a 2 s outage, and the minute apart, not a 62 s outage.
func TestAnOutageIsLoggedAsItWasSeen(t *testing.T) {
	var buf bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		},
	}))
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	o := newOutageLog(logger, 10*time.Second, func() time.Time { return now })
	p := Policy{Name: "pix"}
	cause := errors.New("dial tcp: connection refused")

	o.failed(p, cause)
	now = now.Add(time.Second)
	o.failed(p, cause) // within the interval: held back
	now = now.Add(time.Second)
	o.failed(p, cause)
	now = now.Add(time.Minute) // Redis came back; nobody paid for a minute
	o.decided(p)
	o.decided(p) // once

	got := strings.Split(strings.TrimSpace(buf.String()), "\n")
	want := []string{
		`level=ERROR msg="rate limiter unavailable" policy=pix cause="dial tcp: connection refused" outage=0s held_back=0`,
		`level=INFO msg="rate limiter recovered" policy=pix outage=2s last_failure_ago=1m0s held_back=2`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("logged:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
