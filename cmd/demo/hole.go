package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"strings"
	"time"

	"github.com/pixlimit/pixlimit/internal/ratelimit"
)

// hole: the algorithms side by side, straight on the limiter (no HTTP): the same boundary burst
// against a fixed window, the sliding log and the sliding window counter, then a token bucket's
// burst and refill, drawn as timelines.
func hole(ctx context.Context, d *demo) error {
	rdb := d.lab
	l, err := ratelimit.New(rdb, ratelimit.Options{KeySecret: []byte(rand.Text() + rand.Text()), Timeout: time.Second})
	if err != nil {
		return err
	}
	const limit, window = 5, 2 * time.Second
	run := rand.Text()[:6] // fresh keys for every run
	ask := func(p ratelimit.Policy) bool {
		r, err := l.Allow(ctx, p, run)
		return err == nil && r.Allowed
	}
	marks := func(p ratelimit.Policy, n int) (string, int) {
		var b strings.Builder
		admitted := 0
		for range n {
			if ask(p) {
				b.WriteString(d.out.paint("32", "✔"))
				admitted++
			} else {
				b.WriteString(d.out.paint("31", "✘"))
			}
		}
		return b.String(), admitted
	}

	// Fixed windows start on multiples of the window in Redis time: aim 300ms before the next one.
	t, err := rdb.Time(ctx).Result()
	if err != nil {
		return err
	}
	skew := time.Until(t)
	boundary := t.Truncate(window).Add(window)
	if boundary.Sub(t) < 400*time.Millisecond {
		boundary = boundary.Add(window)
	}
	d.out.say("Each algorithm allows %d requests per %v. A client sends %d just before a window boundary and %d just after.",
		limit, window, limit, limit)
	if err := sleepUntil(ctx, boundary.Add(-300*time.Millisecond-skew)); err != nil {
		return err
	}
	algos := []ratelimit.Algorithm{ratelimit.FixedWindow, ratelimit.SlidingLog, ratelimit.SlidingWindow}
	before := map[ratelimit.Algorithm]string{}
	total := map[ratelimit.Algorithm]int{}
	for _, a := range algos {
		before[a], total[a] = marks(ratelimit.Policy{Name: "hole", Limit: limit, Window: window, Algorithm: a}, limit)
	}
	if err := sleepUntil(ctx, boundary.Add(100*time.Millisecond-skew)); err != nil {
		return err
	}
	fmt.Fprintf(d.out.w, "\n  %-15s %-12s | %-12s  %s\n", "", "t−0.3s", "t+0.1s", "(t = a window boundary)")
	for _, a := range algos {
		after, n := marks(ratelimit.Policy{Name: "hole", Limit: limit, Window: window, Algorithm: a}, limit)
		total[a] += n
		fmt.Fprintf(d.out.w, "  %-15s %s        | %s         %d admitted in 0.4s\n", a, before[a], after, total[a])
	}
	d.expect(fmt.Sprintf("fixed window: %d admitted across the boundary, twice its limit", 2*limit),
		total[ratelimit.FixedWindow] == 2*limit, fmt.Sprint(total[ratelimit.FixedWindow]))
	d.expect(fmt.Sprintf("sliding log: %d, never more than the limit in any window", limit),
		total[ratelimit.SlidingLog] == limit, fmt.Sprint(total[ratelimit.SlidingLog]))
	d.expect("sliding window counter: the hole closed too (≤ the limit + 1)",
		total[ratelimit.SlidingWindow] <= limit+1, fmt.Sprint(total[ratelimit.SlidingWindow]))

	every := window / limit / 2
	d.out.say("A token bucket and GCRA, each %d at once and %d per %v after (one every %v): %d requests at once,\n"+
		"then one every %v for %v.", limit, limit, window, window/limit, 2*limit, every, window)
	buckets := []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.GCRA}
	burst, lines, atOnce, refilled := map[ratelimit.Algorithm]string{}, map[ratelimit.Algorithm]*strings.Builder{}, map[ratelimit.Algorithm]int{}, map[ratelimit.Algorithm]int{}
	policy := func(a ratelimit.Algorithm) ratelimit.Policy {
		return ratelimit.Policy{Name: "hole", Limit: limit, Window: window, Burst: limit, Algorithm: a}
	}
	for _, a := range buckets {
		burst[a], atOnce[a] = marks(policy(a), 2*limit)
		lines[a] = &strings.Builder{}
	}
	for start := time.Now(); time.Since(start) < window; {
		if err := sleepUntil(ctx, time.Now().Add(every)); err != nil {
			return err
		}
		for _, a := range buckets {
			m, n := marks(policy(a), 1)
			lines[a].WriteString(m + " ")
			refilled[a] += n
		}
	}
	fmt.Fprintln(d.out.w)
	for _, a := range buckets {
		fmt.Fprintf(d.out.w, "  %-15s %s | %s\n", a, burst[a], lines[a].String())
	}
	for _, a := range buckets {
		d.expect(fmt.Sprintf("%s: a burst of %d at once", a, limit), atOnce[a] == limit, fmt.Sprint(atOnce[a]))
		d.expect(fmt.Sprintf("%s: then the refill rate, about %d in %v, every other request", a, limit, window),
			refilled[a] >= limit-1 && refilled[a] <= limit+1, fmt.Sprint(refilled[a]))
	}
	return nil
}

func sleepUntil(ctx context.Context, t time.Time) error {
	select {
	case <-time.After(time.Until(t)):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
