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
// against a fixed window, the sliding log (sorted and packed) and the sliding window counter,
// then a token bucket's burst and refill, drawn as timelines.
func hole(ctx context.Context, d *demo) error {
	if d.target {
		d.skip("the 2× hole plays on a Redis of its own, not the deployment: nothing of it to check")
		return nil
	}
	l, err := ratelimit.New(d.lab, ratelimit.Options{KeySecret: []byte(rand.Text() + rand.Text()), Timeout: time.Second})
	if err != nil {
		return err
	}
	lab := &lesson{d: d, l: l, identity: rand.Text()[:6]} // fresh keys for every run
	if err := lab.boundary(ctx); err != nil {
		return err
	}
	return lab.buckets(ctx)
}

// lesson runs one identity's requests straight on a limiter and draws them.
type lesson struct {
	d        *demo
	l        *ratelimit.Limiter
	identity string
}

const lessonLimit, lessonWindow = 5, 2 * time.Second

func lessonPolicy(a ratelimit.Algorithm) ratelimit.Policy {
	p := ratelimit.Policy{Name: "hole", Limit: lessonLimit, Window: lessonWindow, Algorithm: a}
	if a.Bursty() {
		p.Burst = lessonLimit
	}
	return p
}

// marks sends n requests under a's policy and draws each: ✔ admitted, ✘ refused; the page gets
// each as a decision of the lesson's phase.
func (s *lesson) marks(ctx context.Context, a ratelimit.Algorithm, n int, phase string) (string, int) {
	var b strings.Builder
	admitted := 0
	for range n {
		dec, err := s.l.AllowAll(ctx, ratelimit.Check{Policy: lessonPolicy(a), Identity: s.identity})
		ok := err == nil && dec.Allowed
		if ok {
			b.WriteString(s.d.out.paint("32", "✔"))
			admitted++
		} else {
			b.WriteString(s.d.out.paint("31", "✘"))
		}
		s.d.out.decision(string(a), phase, ok)
	}
	return b.String(), admitted
}

// boundary sends the limit just before a calendar window boundary and the limit again just
// after, to a fixed window, the sliding log and the sliding window counter.
func (s *lesson) boundary(ctx context.Context) error {
	// Fixed windows start on multiples of the window in Redis time: aim 300ms before the next one.
	t, err := s.d.lab.Time(ctx).Result()
	if err != nil {
		return err
	}
	skew := time.Until(t)
	boundary := t.Truncate(lessonWindow).Add(lessonWindow)
	if boundary.Sub(t) < 400*time.Millisecond {
		boundary = boundary.Add(lessonWindow)
	}
	s.d.out.say("Each algorithm allows %d requests per %v. A client sends %d just before a window boundary and %d just after.",
		lessonLimit, lessonWindow, lessonLimit, lessonLimit)
	if err := sleepUntil(ctx, boundary.Add(-300*time.Millisecond-skew)); err != nil {
		return err
	}
	algos := []ratelimit.Algorithm{ratelimit.FixedWindow, ratelimit.SlidingLog, ratelimit.SlidingLogPacked, ratelimit.SlidingWindow}
	before, total := map[ratelimit.Algorithm]string{}, map[ratelimit.Algorithm]int{}
	for _, a := range algos {
		before[a], total[a] = s.marks(ctx, a, lessonLimit, "before")
	}
	if err := sleepUntil(ctx, boundary.Add(100*time.Millisecond-skew)); err != nil {
		return err
	}
	fmt.Fprintf(s.d.out.w, "\n  %-18s %-12s | %-12s  %s\n", "", "t−0.3s", "t+0.1s", "(t = a window boundary)")
	for _, a := range algos {
		after, n := s.marks(ctx, a, lessonLimit, "after")
		total[a] += n
		fmt.Fprintf(s.d.out.w, "  %-18s %s        | %s         %d admitted in 0.4s\n", a, before[a], after, total[a])
	}
	s.d.expect(fmt.Sprintf("fixed window: %d admitted across the boundary, twice its limit", 2*lessonLimit),
		total[ratelimit.FixedWindow] == 2*lessonLimit, fmt.Sprint(total[ratelimit.FixedWindow]))
	s.d.expect(fmt.Sprintf("sliding log: %d, never more than the limit in any window", lessonLimit),
		total[ratelimit.SlidingLog] == lessonLimit, fmt.Sprint(total[ratelimit.SlidingLog]))
	s.d.expect("the packed log decides as the sorted one, in one string",
		before[ratelimit.SlidingLogPacked] == before[ratelimit.SlidingLog] && total[ratelimit.SlidingLogPacked] == total[ratelimit.SlidingLog],
		fmt.Sprint(total[ratelimit.SlidingLogPacked]))
	s.d.expect(fmt.Sprintf("sliding window counter: the hole closed too (%d or %d: its estimate may admit one more)", lessonLimit, lessonLimit+1),
		total[ratelimit.SlidingWindow] >= lessonLimit && total[ratelimit.SlidingWindow] <= lessonLimit+1, fmt.Sprint(total[ratelimit.SlidingWindow]))
	return nil
}

// buckets sends twice the burst at once to a token bucket and GCRA, then one request every half
// interval for a window: the burst, then the refill rate.
func (s *lesson) buckets(ctx context.Context) error {
	every := lessonWindow / lessonLimit / 2
	s.d.out.say("A token bucket and GCRA, each %d at once and %d per %v after (one every %v): %d requests at once,\n"+
		"then one every %v for %v.", lessonLimit, lessonLimit, lessonWindow, lessonWindow/lessonLimit, 2*lessonLimit, every, lessonWindow)
	algos := []ratelimit.Algorithm{ratelimit.TokenBucket, ratelimit.GCRA}
	burst, lines := map[ratelimit.Algorithm]string{}, map[ratelimit.Algorithm]*strings.Builder{}
	atOnce, refilled := map[ratelimit.Algorithm]int{}, map[ratelimit.Algorithm]int{}
	for _, a := range algos {
		burst[a], atOnce[a] = s.marks(ctx, a, 2*lessonLimit, "burst")
		lines[a] = &strings.Builder{}
	}
	for start := time.Now(); time.Since(start) < lessonWindow; {
		if err := sleepUntil(ctx, time.Now().Add(every)); err != nil {
			return err
		}
		for _, a := range algos {
			m, n := s.marks(ctx, a, 1, "refill")
			lines[a].WriteString(m + " ")
			refilled[a] += n
		}
	}
	fmt.Fprintln(s.d.out.w)
	for _, a := range algos {
		fmt.Fprintf(s.d.out.w, "  %-18s %s | %s\n", a, burst[a], lines[a].String())
	}
	for _, a := range algos {
		s.d.expect(fmt.Sprintf("%s: a burst of %d at once", a, lessonLimit), atOnce[a] == lessonLimit, fmt.Sprint(atOnce[a]))
		s.d.expect(fmt.Sprintf("%s: then the refill rate, about %d in %v, every other request", a, lessonLimit, lessonWindow),
			refilled[a] >= lessonLimit-1 && refilled[a] <= lessonLimit+1, fmt.Sprint(refilled[a]))
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
