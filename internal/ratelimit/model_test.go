package ratelimit

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pixlimit/pixlimit/internal/testing/clocktest"
	"github.com/pixlimit/pixlimit/internal/testing/redistest"
)

// A model is a pure-Go statement of what one algorithm's script must decide: the same
// arithmetic, in plain sight, over in-memory state. TestScriptsMatchModels drives both with the
// same requests and times.
type model interface {
	// decide admits or refuses one request at now (µs) over keys, recording it in every key or in
	// none, and returns each key's remaining and reset (µs), as the scripts do.
	decide(now int64, keys []string, policies []Policy) (allowed bool, remaining, reset []int64)
}

func newModel(a Algorithm) model {
	switch a {
	case SlidingLog, SlidingLogPacked: // one log, two encodings
		return &logModel{entries: map[string][]int64{}}
	case FixedWindow:
		return &fixedModel{state: map[string][2]int64{}}
	case SlidingWindow:
		return &slidingModel{state: map[string][3]int64{}}
	case TokenBucket:
		return &bucketModel{state: map[string][2]int64{}}
	case GCRA:
		return &gcraModel{tat: map[string][2]int64{}}
	}
	panic(a)
}

type logModel struct{ entries map[string][]int64 }

func (m *logModel) decide(now int64, keys []string, ps []Policy) (bool, []int64, []int64) {
	full := false
	for i, k := range keys {
		w := ps[i].Window.Microseconds()
		kept := m.entries[k][:0:0]
		for _, t := range m.entries[k] {
			if t > now-w {
				kept = append(kept, t)
			}
		}
		m.entries[k] = kept
		full = full || len(kept) >= ps[i].Limit
	}
	rem, reset := make([]int64, len(keys)), make([]int64, len(keys))
	for i, k := range keys {
		if !full {
			m.entries[k] = append(m.entries[k], now)
		}
		n, limit := len(m.entries[k]), ps[i].Limit
		rem[i] = int64(max(0, limit-n))
		if n > 0 {
			reset[i] = m.entries[k][max(0, n-limit)] + ps[i].Window.Microseconds() - now
		}
	}
	return !full, rem, reset
}

type fixedModel struct{ state map[string][2]int64 } // index, count

func (m *fixedModel) decide(now int64, keys []string, ps []Policy) (bool, []int64, []int64) {
	full := false
	for i, k := range keys {
		w := ps[i].Window.Microseconds()
		if s := m.state[k]; s[0] != now/w {
			m.state[k] = [2]int64{now / w, 0}
		}
		full = full || m.state[k][1] >= int64(ps[i].Limit)
	}
	rem, reset := make([]int64, len(keys)), make([]int64, len(keys))
	for i, k := range keys {
		w, s := ps[i].Window.Microseconds(), m.state[k]
		if !full {
			s[1]++
			m.state[k] = s
		}
		rem[i] = max(0, int64(ps[i].Limit)-s[1])
		if s[1] > 0 {
			reset[i] = (s[0]+1)*w - now
		}
	}
	return !full, rem, reset
}

type slidingModel struct{ state map[string][3]int64 } // index, prev, curr

func (m *slidingModel) decide(now int64, keys []string, ps []Policy) (bool, []int64, []int64) {
	full := false
	for i, k := range keys {
		w, s := ps[i].Window.Microseconds(), m.state[k]
		switch idx := now / w; {
		case s[0] == idx:
		case s[0] == idx-1:
			s = [3]int64{idx, s[2], 0}
		default:
			s = [3]int64{idx, 0, 0}
		}
		m.state[k] = s
		elapsed := now - s[0]*w
		full = full || s[1]*(w-elapsed)+(s[2]+1)*w > int64(ps[i].Limit)*w
	}
	rem, reset := make([]int64, len(keys)), make([]int64, len(keys))
	for i, k := range keys {
		w, s, limit := ps[i].Window.Microseconds(), m.state[k], int64(ps[i].Limit)
		if !full {
			s[2]++
			m.state[k] = s
		}
		elapsed := now - s[0]*w
		spent := s[1]*(w-elapsed) + s[2]*w
		rem[i] = max(0, floorDiv(limit*w-spent, w))
		target := limit - rem[i] - 1
		if spent > 0 && target >= 0 {
			if s[2] <= target {
				reset[i] = w - floorDiv((target-s[2])*w, s[1]) - elapsed
			} else {
				reset[i] = w - elapsed + w - floorDiv(target*w, s[2])
			}
		}
	}
	return !full, rem, reset
}

type bucketModel struct{ state map[string][2]int64 } // scaled tokens, time

func (m *bucketModel) decide(now int64, keys []string, ps []Policy) (bool, []int64, []int64) {
	full := false
	levels := make([]int64, len(keys))
	for i, k := range keys {
		w, limit := ps[i].Window.Microseconds(), int64(ps[i].Limit)
		capacity := int64(ps[i].Capacity()) * w
		levels[i] = capacity
		if s, ok := m.state[k]; ok {
			levels[i] = min(capacity, s[0]+max(0, now-s[1])*limit)
		}
		full = full || levels[i] < w
	}
	rem, reset := make([]int64, len(keys)), make([]int64, len(keys))
	for i, k := range keys {
		w, limit := ps[i].Window.Microseconds(), int64(ps[i].Limit)
		capacity := int64(ps[i].Capacity()) * w
		if !full {
			levels[i] -= w
			m.state[k] = [2]int64{levels[i], now}
		}
		rem[i] = levels[i] / w
		if levels[i] < capacity {
			reset[i] = ceilDiv((rem[i]+1)*w-levels[i], limit)
		}
	}
	return !full, rem, reset
}

// gcraModel keeps each key's TAT exact, as gcra.lua does: whole µs and a numerator over the
// limit; it decides in 1/limit µs, where the emission interval is the window.
type gcraModel struct{ tat map[string][2]int64 }

func (m *gcraModel) decide(now int64, keys []string, ps []Policy) (bool, []int64, []int64) {
	full := false
	aheads := make([]int64, len(keys))
	for i, k := range keys {
		limit, w, burst := int64(ps[i].Limit), ps[i].Window.Microseconds(), int64(ps[i].Capacity())
		if st, ok := m.tat[k]; ok {
			aheads[i] = max(0, (st[0]-now)*limit+min(st[1], limit-1))
		}
		full = full || aheads[i]+w > burst*w
	}
	rem, reset := make([]int64, len(keys)), make([]int64, len(keys))
	for i, k := range keys {
		limit, w, burst, a := int64(ps[i].Limit), ps[i].Window.Microseconds(), int64(ps[i].Capacity()), aheads[i]
		if !full {
			a += w
			m.tat[k] = [2]int64{now + a/limit, a % limit}
		}
		rem[i] = max(0, (burst*w-a)/w)
		if a > 0 {
			reset[i] = (a - (burst-rem[i]-1)*w + limit - 1) / limit
		}
	}
	return !full, rem, reset
}

func floorDiv(a, b int64) int64 { return int64(math.Floor(float64(a) / float64(b))) }
func ceilDiv(a, b int64) int64  { return int64(math.Ceil(float64(a) / float64(b))) }

// TestScriptsMatchModels drives each script and its model through the same few thousand random
// requests over two keys, alone and together, with injected time that runs twice as fast as the
// real clock, so that the keys' real TTLs never expire state the model still holds (a TTL counts
// from when Redis ran the script, which a loaded machine delays after the time was taken: at
// the real clock's pace, a key expired a few milliseconds before the model's entries left the
// window), and requires the same decision, the same Remaining and the same Reset (within a
// millisecond) at every step.
func TestScriptsMatchModels(t *testing.T) {
	for _, a := range meters() {
		t.Run(string(a), func(t *testing.T) {
			t.Parallel()
			l, _, _ := newTestLimiter(t)
			m := newModel(a)
			pa := Policy{Name: "a", Limit: 5, Window: 10 * time.Second, Algorithm: a}
			pb := Policy{Name: "b", Limit: 3, Window: 7 * time.Second, Algorithm: a}
			if a.Bursty() {
				pa.Burst = 8
			}
			rng := rand.New(rand.NewPCG(7, uint64(len(a))))
			start, base := time.Now(), time.UnixMicro(1_800_000_000_000_000)
			var jumps time.Duration
			steps := map[bool]int{}
			for step := range 3000 {
				switch r := rng.IntN(100); {
				case r < 70:
					jumps += time.Duration(rng.IntN(700)) * time.Millisecond
				case r < 95:
					jumps += time.Duration(rng.IntN(3000)) * time.Microsecond
				default:
					jumps += time.Duration(rng.IntN(20)) * time.Second
				}
				now := base.Add(2*time.Since(start) + jumps).Truncate(time.Microsecond)
				l.now = func() time.Time { return now }
				var checks []Check
				var keys []string
				var ps []Policy
				switch rng.IntN(3) {
				case 0:
					checks, keys, ps = []Check{{pa, "x"}}, []string{"a"}, []Policy{pa}
				case 1:
					checks, keys, ps = []Check{{pb, "x"}}, []string{"b"}, []Policy{pb}
				default:
					checks, keys, ps = []Check{{pa, "x"}, {pb, "x"}}, []string{"a", "b"}, []Policy{pa, pb}
				}
				d := mustAllow(t, l, checks...)
				allowed, rem, reset := m.decide(now.UnixMicro(), keys, ps)
				steps[allowed]++
				if d.Allowed != allowed {
					t.Fatalf("step %d at +%v on %v: script allowed=%v, model %v", step, jumps, keys, d.Allowed, allowed)
				}
				for i, r := range d.Results {
					if int64(r.Remaining) != rem[i] {
						t.Fatalf("step %d key %s: script remaining %d, model %d", step, keys[i], r.Remaining, rem[i])
					}
					if diff := r.Reset.Microseconds() - reset[i]; diff < -1000 || diff > 1000 {
						t.Fatalf("step %d key %s: script reset %v, model %v", step, keys[i], r.Reset, time.Duration(reset[i])*time.Microsecond)
					}
				}
			}
			if steps[true] < 300 || steps[false] < 300 {
				t.Errorf("%d admitted, %d refused: the run did not exercise both sides", steps[true], steps[false])
			}
		})
	}
}

// TestALongerWindowLocksNoKey: a key's name does not hold its policy's window, so a window made
// longer (a redeploy, or a rolling update whose old and new replicas share the keys) meets state
// stored under the shorter one. The window counters read its window index as one far ahead;
// taken for a clock step, it locked the key for centuries (a key PTTL of 514 years, and a
// Retry-After overflowing to minus 71). Now state of another length is void: the fourth request
// of three is refused until a window passes at most, and its key lives no longer.
func TestALongerWindowLocksNoKey(t *testing.T) {
	for _, a := range meters() {
		t.Run(string(a), func(t *testing.T) {
			t.Parallel()
			l, rdb, _ := newTestLimiter(t)
			clk := withClock(l)
			short := Policy{Name: "pix", Limit: 3, Window: time.Second, Algorithm: a}
			mustAllow(t, l, Check{short, "acct"})
			clk.Add(100 * time.Millisecond)
			long := short
			long.Window = 10 * time.Second
			var d Decision
			for range 4 {
				d = mustAllow(t, l, Check{long, "acct"})
			}
			ttl := rdb.PTTL(t.Context(), l.Key(Check{long, "acct"})).Val()
			if d.Allowed || d.Worst.RetryAfter <= 0 || d.Worst.RetryAfter > 2*long.Window || ttl > 2*long.Window {
				t.Errorf("the fourth request under the window made %v: allowed %v, Retry-After %v, key TTL %v; want refused for a window at most",
					long.Window, d.Allowed, d.Worst.RetryAfter, ttl)
			}
		})
	}
}

// TestAStepBackOfSeveralWindowsAdmitsNoMore: a clock that steps back by more than a window (2.5
// s on a 1 s window) is still a step back, not a window raised: a full key stays full until the
// window it was filled in ends (the counters keep its count; the logs score their entries).
func TestAStepBackOfSeveralWindowsAdmitsNoMore(t *testing.T) {
	for _, a := range meters() {
		t.Run(string(a), func(t *testing.T) {
			t.Parallel()
			l, _, _ := newTestLimiter(t)
			clk := withClock(l)
			c := Check{Policy{Name: "p", Limit: 3, Window: time.Second, Algorithm: a}, "acct"}
			for range 3 {
				mustAllow(t, l, c)
			}
			clk.Add(-2500 * time.Millisecond)
			if d := mustAllow(t, l, c); d.Allowed {
				t.Errorf("after a step back of 2.5 windows: admitted, want refused (three in the window already)")
			}
		})
	}
}

// TestAClockSteppingBackAdmitsNoMore: Redis's clock can step back (NTP, a failover to a replica
// whose clock is behind). A key decided on such a clock must admit no more than a key decided
// on the same clock held at the latest time it has shown: a fixed or sliding window's count must
// not be wiped by a step back across a window's edge, nor a bucket refill a span twice. The
// sorted-set log alone may admit more, one at most per admission it scored while the clock was
// behind (sliding_log.lua says why).
func TestAClockSteppingBackAdmitsNoMore(t *testing.T) {
	for _, a := range meters() {
		t.Run(string(a), func(t *testing.T) {
			t.Parallel()
			l, _, _ := newTestLimiter(t)
			p := Policy{Name: "p", Limit: 5, Window: 10 * time.Second, Algorithm: a}
			rng := rand.New(rand.NewPCG(11, uint64(len(a))))
			at, latest := time.UnixMicro(1_800_000_000_000_000), time.Time{}
			stepped, held, backs, behind := 0, 0, 0, 0
			for step := range 2000 {
				if rng.IntN(10) == 0 {
					at, backs = at.Add(-time.Duration(rng.IntN(4000))*time.Millisecond), backs+1
				} else {
					at = at.Add(time.Duration(rng.IntN(1500)) * time.Millisecond)
				}
				if at.After(latest) {
					latest = at
				}
				now := at
				l.now = func() time.Time { return now }
				if mustAllow(t, l, Check{p, "stepped"}).Allowed {
					stepped++
					if a == SlidingLog && now.Before(latest) {
						behind++
					}
				}
				now = latest
				if mustAllow(t, l, Check{p, "held"}).Allowed {
					held++
				}
				if stepped > held+behind {
					t.Fatalf("step %d: %d admitted on the clock that steps back (%d scored behind), %d on the one held at its latest", step, stepped, behind, held)
				}
			}
			if backs < 100 || held < 300 {
				t.Errorf("%d steps back, %d admitted: the run did not exercise both", backs, held)
			}
		})
	}
}

// TestABucketRefillsASpanOnce: a token bucket drawn at a time earlier than its last draw (the
// clock stepped back) refills nothing until the clock is past that draw again, and then counts
// from it: the span between is refilled once, not twice.
func TestABucketRefillsASpanOnce(t *testing.T) {
	t.Parallel()
	l, _, _ := newTestLimiter(t)
	clk := withClock(l)
	p := Policy{Name: "b", Limit: 10, Window: 10 * time.Second, Algorithm: TokenBucket} // a token a second
	for range 10 {
		mustAllow(t, l, Check{p, "k"})
	}
	start := clk.Now()
	for _, step := range []struct {
		at   time.Duration
		want int // Remaining after it
	}{
		{5 * time.Second, 4}, // 5 refilled, 1 taken
		{1 * time.Second, 3}, // the clock 4s back: nothing refilled, 1 taken
		{5 * time.Second, 2}, // back where it was: still nothing refilled, 1 taken
		{7 * time.Second, 3}, // 2 refilled since 5s, 1 taken
	} {
		clk.Set(start.Add(step.at))
		if got := mustAllow(t, l, Check{p, "k"}).Results[0].Remaining; got != step.want {
			t.Fatalf("a draw at +%v: %d remaining, want %d", step.at, got, step.want)
		}
	}
}

// TestEveryAlgorithmIsExactUnderConcurrency: 50 concurrent requests over 3 replicas admit
// exactly what the algorithm allows at once: the limit, or the burst for the buckets.
func TestEveryAlgorithmIsExactUnderConcurrency(t *testing.T) {
	srv := redistest.Start(t)
	ls := replicas(t, srv, 3, generous)
	clk := clocktest.New() // one instant for all 50: no calendar window's edge falls among them
	for _, l := range ls {
		l.now = clk.Now
	}
	for _, a := range meters() {
		t.Run(string(a), func(t *testing.T) {
			p := Policy{Name: "conc", Limit: 10, Window: time.Hour, Algorithm: a}
			want := 10
			if a.Bursty() {
				p.Burst, want = 7, 7
			}
			var admitted atomic.Int64
			var wg sync.WaitGroup
			for g := range 50 {
				wg.Go(func() {
					d, err := ls[g%3].AllowAll(context.Background(), Check{Policy: p, Identity: "one-key"})
					if err != nil {
						t.Error(err)
					}
					if d.Allowed {
						admitted.Add(1)
					}
				})
			}
			wg.Wait()
			if got := admitted.Load(); got != int64(want) {
				t.Errorf("50 concurrent requests over 3 replicas: %d admitted, want exactly %d", got, want)
			}
		})
	}
}

// boundaryBurst sends limit requests just before a calendar window boundary and limit more just
// after it, on the injected clock (10 ms before it, then 10 ms after), and returns how many of the
// second burst were admitted and how far past the boundary they were sent.
func boundaryBurst(t *testing.T, l *Limiter, clk *clock, p Policy) (int, time.Duration) {
	t.Helper()
	w := p.Window
	boundary := clk.Now().Truncate(w).Add(w)
	clk.Set(boundary.Add(-10 * time.Millisecond))
	for i := range p.Limit {
		if !mustAllow(t, l, Check{p, "edge"}).Allowed {
			t.Fatalf("%s: request %d of the first burst refused", p.Algorithm, i+1)
		}
	}
	late := 10 * time.Millisecond
	clk.Set(boundary.Add(late))
	second := 0
	for range p.Limit {
		if mustAllow(t, l, Check{p, "edge"}).Allowed {
			second++
		}
	}
	return second, late
}

// TestBoundaryBursts shows the hole a fixed window has and the others close: the limit just
// before a window boundary, the limit again just after. The scripts compute windows from the
// time they are given, the Redis clock's in production (TestRedisClock).
func TestBoundaryBursts(t *testing.T) {
	for _, a := range []Algorithm{FixedWindow, SlidingLog, SlidingWindow} {
		t.Run(string(a), func(t *testing.T) {
			t.Parallel()
			l, _, _ := newTestLimiter(t)
			clk := withClock(l)
			p := Policy{Name: "edge", Limit: 10, Window: time.Second, Algorithm: a}
			second, late := boundaryBurst(t, l, clk, p)
			t.Logf("%s: %d of the second burst admitted, %v after the boundary", a, second, late)
			switch a {
			case FixedWindow:
				if second != p.Limit {
					t.Errorf("fixed window admitted %d of the second burst, want all %d: the 2× hole", second, p.Limit)
				}
			case SlidingLog:
				if second != 0 {
					t.Errorf("sliding log admitted %d right after %d, want 0", second, p.Limit)
				}
			case SlidingWindow:
				// The previous window still weighs (W − elapsed)/W: only limit × elapsed/W fit.
				bound := int(math.Ceil(float64(p.Limit) * float64(late) / float64(p.Window)))
				if second > bound {
					t.Errorf("sliding window admitted %d, %v into the window; its bound is %d", second, late, bound)
				}
			}
		})
	}
}

// TestBucketsBurstThenRefill: a token bucket and GCRA with burst 5 and 20 per second admit 5 at
// once, then one request per 50ms, evenly, as a client polling every 5ms for a second sees (on
// the injected clock: the same second on any machine).
func TestBucketsBurstThenRefill(t *testing.T) {
	for _, a := range []Algorithm{TokenBucket, GCRA} {
		t.Run(string(a), func(t *testing.T) {
			t.Parallel()
			l, _, _ := newTestLimiter(t)
			clk := withClock(l)
			p := Policy{Name: "bucket", Limit: 20, Window: time.Second, Burst: 5, Algorithm: a}
			burst := 0
			for range 10 {
				if mustAllow(t, l, Check{p, "k"}).Allowed {
					burst++
				}
			}
			if burst != 5 {
				t.Fatalf("%s: %d of 10 at once admitted, want the burst of 5", a, burst)
			}
			var admitted []time.Duration
			for at := 5 * time.Millisecond; at <= time.Second; at += 5 * time.Millisecond {
				clk.Add(5 * time.Millisecond)
				if mustAllow(t, l, Check{p, "k"}).Allowed {
					admitted = append(admitted, at)
				}
			}
			if n := len(admitted); n != 20 {
				t.Errorf("%s: %d admitted in the second after the burst, want 20 (the refill rate)", a, n)
			}
			for i := 1; i < len(admitted); i++ {
				if gap := admitted[i] - admitted[i-1]; gap != 50*time.Millisecond {
					t.Errorf("%s: admissions %d and %d %v apart, want 50ms: evenly, no burst", a, i, i+1, gap)
				}
			}
		})
	}
}

// TestGCRADecidesAsATokenBucket: GCRA and a token bucket of the same policy give the same
// answers to the microsecond (admission, Remaining, Reset, RetryAfter), for every limit from 1 to
// 100 per minute and a third of those per 10 minutes and per hour (intervals rarely a whole
// microsecond): a whole burst at one instant, as a batch decides it, then requests now and then.
// (The instant is the test's clock; a key's TTL counts on Redis's, from an interval: 600 ms at
// the shortest here. Per second, 10 ms, a loaded machine's stall between two requests let a key
// expire under the burst.)
// A float schedule refused the last request of 37 of the 100 bursts per minute.
func TestGCRADecidesAsATokenBucket(t *testing.T) {
	t.Parallel()
	l, _, _ := newTestLimiter(t)
	clk := withClock(l)
	for _, window := range []time.Duration{time.Minute, 10 * time.Minute, time.Hour} {
		for limit := 1; limit <= 100; limit++ {
			if window != time.Minute && limit%3 != 0 {
				continue
			}
			gcra := Policy{Name: "g", Limit: limit, Window: window, Algorithm: GCRA}
			bucket := Policy{Name: "b", Limit: limit, Window: window, Algorithm: TokenBucket}
			id, admitted := fmt.Sprintf("%d-%v", limit, window), 0
			for step := range limit + 6 {
				if step > limit { // past the burst: a while later, off any interval
					clk.Add(window/7 + time.Duration(step)*time.Microsecond)
				}
				g, b := mustAllow(t, l, Check{gcra, id}), mustAllow(t, l, Check{bucket, id})
				if step < limit && g.Allowed {
					admitted++
				}
				gr, br := g.Results[0], b.Results[0]
				if g.Allowed != b.Allowed || gr.Remaining != br.Remaining || gr.Reset != br.Reset || gr.RetryAfter != br.RetryAfter {
					t.Fatalf("%d per %v, request %d: gcra allowed=%v remaining=%d reset=%v retry=%v; token bucket %v %d %v %v",
						limit, window, step+1, g.Allowed, gr.Remaining, gr.Reset, gr.RetryAfter, b.Allowed, br.Remaining, br.Reset, br.RetryAfter)
				}
			}
			if admitted != limit {
				t.Fatalf("%d per %v: %d of a burst of %d at one instant admitted, want all", limit, window, admitted, limit)
			}
		}
	}
}

// TestRetryAfterIsExact: for every meter, a full key refuses until exactly RetryAfter has
// passed, then admits, and insisting in between does not move that moment.
func TestRetryAfterIsExact(t *testing.T) {
	for _, a := range meters() {
		t.Run(string(a), func(t *testing.T) {
			t.Parallel()
			l, _, _ := newTestLimiter(t)
			clk := withClock(l)
			clk.Add(1234567 * time.Microsecond) // not on a window boundary
			p := Policy{Name: "exact", Limit: 4, Window: 10 * time.Second, Algorithm: a}
			var d Decision
			for range 20 {
				clk.Add(300 * time.Millisecond)
				if d = mustAllow(t, l, Check{p, "k"}); !d.Allowed {
					break
				}
			}
			if d.Allowed || d.Worst.RetryAfter <= 0 {
				t.Fatalf("never refused: %+v", d.Worst)
			}
			unblock := clk.Now().Add(d.Worst.RetryAfter)
			for range 5 {
				clk.Add(d.Worst.RetryAfter / 7)
				if d := mustAllow(t, l, Check{p, "k"}); d.Allowed {
					t.Fatalf("admitted before RetryAfter elapsed")
				} else if got := clk.Now().Add(d.Worst.RetryAfter); got.Sub(unblock).Abs() > time.Microsecond {
					t.Fatalf("insisting moved the unblock time by %v", got.Sub(unblock))
				}
			}
			clk.Set(unblock.Add(-time.Millisecond))
			if mustAllow(t, l, Check{p, "k"}).Allowed {
				t.Fatal("admitted 1ms before RetryAfter elapsed")
			}
			clk.Set(unblock)
			if !mustAllow(t, l, Check{p, "k"}).Allowed {
				t.Fatal("refused when RetryAfter elapsed")
			}
		})
	}
}

// TestSlidingWindowErrorBound runs random bursty traffic through the sliding window counter and
// checks its documented bound: any interval one window long admits at most 2 × limit (each
// calendar window's own count never exceeds the limit, and such an interval overlaps two).
func TestSlidingWindowErrorBound(t *testing.T) {
	t.Parallel()
	l, _, _ := newTestLimiter(t)
	clk := withClock(l)
	p := Policy{Name: "bound", Limit: 10, Window: 10 * time.Second, Algorithm: SlidingWindow}
	rng := rand.New(rand.NewPCG(3, 4))
	var admitted []time.Time
	for range 4000 {
		if rng.IntN(10) == 0 {
			clk.Add(time.Duration(rng.IntN(9000)) * time.Millisecond) // a lull
		} else {
			clk.Add(time.Duration(rng.IntN(300)) * time.Millisecond) // a burst
		}
		if mustAllow(t, l, Check{p, "k"}).Allowed {
			admitted = append(admitted, clk.Now())
		}
	}
	worst := 0
	for i, start := range admitted {
		j := sort.Search(len(admitted), func(j int) bool { return !admitted[j].Before(start.Add(p.Window)) })
		worst = max(worst, j-i)
	}
	t.Logf("sliding window, limit %d: at most %d admitted in any %v", p.Limit, worst, p.Window)
	if worst > 2*p.Limit {
		t.Errorf("%d admitted in one window, want at most %d", worst, 2*p.Limit)
	}
}

// TestEveryAlgorithmKeepsTTLs: whatever the meter, and whether a request was admitted or
// refused, every key Redis holds has a TTL, no longer than the algorithm needs it:
// a window (sliding log, fixed window), a window and a quarter (the packed log, which sets its
// TTL once a quarter), two (sliding window: the previous count weighs during the next window),
// or the time the bucket takes to fill (Burst/Limit windows).
func TestEveryAlgorithmKeepsTTLs(t *testing.T) {
	t.Parallel()
	l, rdb, _ := newTestLimiter(t)
	ctx := context.Background()
	bound := map[Algorithm]time.Duration{}
	for _, a := range meters() {
		p := Policy{Name: "ttl", Limit: 3, Window: 20 * time.Second, Algorithm: a}
		q := Policy{Name: "ttl2", Limit: 1, Window: 10 * time.Second, Algorithm: a}
		bound[a] = p.Window
		switch a {
		case SlidingLogPacked:
			bound[a] = p.Window + p.Window/4
		case SlidingWindow:
			bound[a] = 2 * p.Window
		case TokenBucket, GCRA:
			p.Burst = 6
			bound[a] = p.Window * 6 / 3
		}
		for i := range 8 {
			mustAllow(t, l, Check{p, fmt.Sprint("id", i%3)}, Check{q, "shared"}) // q fills: most are refused
			mustAllow(t, l, Check{p, fmt.Sprint("id", i%3)})
		}
	}
	keys, err := rdb.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) < 10 {
		t.Fatalf("only %d keys: the test wrote too little to check anything", len(keys))
	}
	for _, k := range keys {
		ttl, err := rdb.PTTL(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		a := SlidingLog
		for _, alg := range Algorithms()[1:] {
			if strings.Contains(k, ":"+alg.keyTag()+":") {
				a = alg
			}
		}
		if ttl <= 0 || ttl > bound[a] {
			t.Errorf("%s key %s: TTL %v, want in (0, %v]", a, k, ttl, bound[a])
		}
	}
}

// TestGCRARollsForward: during a rolling update, replicas of the float GCRA (the script before
// 49c2326: testdata/gcra_float.lua) and of the exact one decide the same keys. The exact one
// stores a TAT of whole µs as it is and one of µs and n/limit as "<µs + 1>.0<n>", which the float
// one reads as a number a µs later at most; and it reads the float one's TAT rounded up. So a key
// decided by the two in turn errs nowhere, and, a few µs stricter, admits no more than one decided
// by the exact one alone, and never more than one request fewer.
func TestGCRARollsForward(t *testing.T) {
	t.Parallel()
	l, rdb, _ := newTestLimiter(t)
	clk := withClock(l)
	src, err := os.ReadFile("testdata/gcra_float.lua")
	if err != nil {
		t.Fatal(err)
	}
	float := redis.NewScript(string(src))
	p := Policy{Name: "g", Limit: 9, Window: time.Minute, Algorithm: GCRA} // T = 6,666,666 µs and 6/9
	whole := Policy{Name: "w", Limit: 10, Window: time.Minute, Algorithm: GCRA}
	now := clk.Now().UnixMicro()
	for _, tc := range []struct {
		p    Policy
		want string
	}{
		{p, fmt.Sprintf("%d.06", now+6_666_666+1)},
		{whole, fmt.Sprintf("%d", now+6_000_000)},
	} {
		mustAllow(t, l, Check{tc.p, "stored"})
		if got := rdb.Get(t.Context(), l.Key(Check{tc.p, "stored"})).Val(); got != tc.want {
			t.Errorf("%d per minute: stored %q, want %q", tc.p.Limit, got, tc.want)
		}
	}

	rng := rand.New(rand.NewPCG(5, 9))
	alone, mixed, refused, differed := 0, 0, 0, 0
	for step := range 600 {
		clk.Add(time.Duration(rng.IntN(9_000)) * time.Millisecond) // 4.5 s on average, T 6.7 s: a third refused
		a := mustAllow(t, l, Check{p, "alone"}).Allowed
		var m bool
		if step%2 == 0 {
			m = mustAllow(t, l, Check{p, "mixed"}).Allowed
		} else {
			r, err := float.Run(t.Context(), rdb, []string{l.Key(Check{p, "mixed"})}, p.Limit, p.Window.Milliseconds(), "", p.Limit, clk.Now().UnixMicro(), "").Int64Slice()
			if err != nil {
				t.Fatalf("step %d: the float script on the exact one's key: %v", step, err)
			}
			m = r[0] == 1
		}
		if a {
			alone++
		} else {
			refused++
		}
		if m {
			mixed++
		}
		if a != m {
			differed++
		}
		if mixed > alone || mixed < alone-1 {
			t.Fatalf("step %d: %d admitted by both scripts in turn, %d by the exact one alone: want as many, or one fewer", step, mixed, alone)
		}
	}
	t.Logf("%d admitted alone, %d in turn, %d decisions differed", alone, mixed, differed)
	if alone < 200 || refused < 100 {
		t.Errorf("%d admitted, %d refused: the run did not exercise both", alone, refused)
	}
}
