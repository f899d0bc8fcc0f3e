package stalls

import (
	"testing"
	"time"
)

func TestStalled(t *testing.T) {
	base := time.Now()
	at := func(ms int) time.Time { return base.Add(time.Duration(ms) * time.Millisecond) }
	m := &Meter{ticks: []time.Time{at(0), at(1), at(2), at(50), at(51), at(52), at(60), at(61)}}
	for _, tt := range []struct {
		start, end int
		want       time.Duration
	}{
		{0, 2, 0},                        // every millisecond noted
		{0, 52, 47 * time.Millisecond},   // 2 → 50: 48 ms without a note, 1 of them the period
		{10, 52, 39 * time.Millisecond},  // the stall counts only from start
		{10, 20, 9 * time.Millisecond},   // and only up to end
		{51, 58, 5 * time.Millisecond},   // up to end
		{0, 61, 54 * time.Millisecond},   // two stalls: 47 ms and 7 ms
		{61, 80, 18 * time.Millisecond},  // after the last note, up to end
		{100, 110, 9 * time.Millisecond}, // wholly after the notes
	} {
		if got := m.Stalled(at(tt.start), at(tt.end)); got != tt.want {
			t.Errorf("Stalled(%d ms, %d ms) = %v, want %v", tt.start, tt.end, got, tt.want)
		}
	}
}

// TestWatchSeesAStall holds the watcher off the CPU (it is a goroutine of this process: a lock it
// needs stands in for a scheduler that runs something else) and checks the Meter saw it.
func TestWatchSeesAStall(t *testing.T) {
	m := Watch(t)
	time.Sleep(5 * time.Millisecond)
	start := time.Now()
	m.mu.Lock()
	time.Sleep(60 * time.Millisecond)
	m.mu.Unlock()
	time.Sleep(5 * time.Millisecond)
	end := time.Now()
	if got := m.Stalled(start, end); got < 50*time.Millisecond || got > end.Sub(start) {
		t.Errorf("Stalled over a 60 ms stall = %v, want 50 ms or more, at most the interval's %v", got, end.Sub(start))
	}
	if got, want := m.Within(start, end), end.Sub(start)-m.Stalled(start, end); got != want {
		t.Errorf("Within = %v, want %v", got, want)
	}
}
