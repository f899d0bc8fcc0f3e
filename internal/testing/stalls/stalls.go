// Package stalls tells a wait the code under test made from one the machine imposed. A test that
// asserts "answered within the budget" measures wall time, and on a loaded runner (two cores, the
// race detector, other packages' tests and a browser beside it) the scheduler can hold every
// goroutine of the process off the CPU for longer than the slack the test allows. A Meter runs a
// goroutine that only sleeps a millisecond at a time and notes when it ran: a gap in its notes is
// a stretch when nothing of the process could run, and a test subtracts the gaps inside a
// measured interval, all of them, before it compares the interval with its budget. On a machine
// whose other work (two CPU burners beside the suite) takes the cores in many short slices, no
// one gap is long, but together they are: each slice delays the code under test as it delays the
// watcher. The code under test cannot cause such a gap by waiting (a goroutine blocked on a
// timer, a socket or a lock leaves the others running), so the excuse never hides a wait of its
// own.
package stalls

import (
	"slices"
	"sync"
	"testing"
	"time"
)

// period is how long the watcher sleeps between notes; a gap longer than it is a stall.
const period = time.Millisecond

// Meter notes when its watcher goroutine ran, from Watch until the test ends.
type Meter struct {
	mu    sync.Mutex
	ticks []time.Time // in order
}

// Watch starts a Meter that stops when t ends.
func Watch(t testing.TB) *Meter {
	t.Helper()
	m := &Meter{ticks: []time.Time{time.Now()}}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(period)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				m.mu.Lock()
				m.ticks = append(m.ticks, time.Now()) // when it ran, not when the tick was due
				m.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-done })
	return m
}

// Took is how long since start the code under test took, not counting the longest stall of the
// process in that time.
func (m *Meter) Took(start time.Time) time.Duration { return m.Within(start, time.Now()) }

// Just is took, the length of an interval that ended just now (a response's), less the stalls of
// the process in it.
func (m *Meter) Just(took time.Duration) time.Duration {
	end := time.Now()
	return m.Within(end.Add(-took), end)
}

// Within is end − start less the stalls of the process between them.
func (m *Meter) Within(start, end time.Time) time.Duration {
	return end.Sub(start) - m.Stalled(start, end)
}

// Stalled is how long, between start and end, the watcher could not run beyond its own period:
// the sum of its gaps' excess.
func (m *Meter) Stalled(start, end time.Time) time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	// The last note at or before start, then every note up to end.
	i, _ := slices.BinarySearchFunc(m.ticks, start, func(t, s time.Time) int { return t.Compare(s) })
	if i > 0 {
		i--
	}
	stalled := time.Duration(0)
	prev := m.ticks[i]
	for _, at := range append(m.ticks[i+1:len(m.ticks):len(m.ticks)], end) {
		if at.After(end) {
			at = end
		}
		from := prev
		if from.Before(start) {
			from = start
		}
		if gap := at.Sub(from) - period; gap > 0 {
			stalled += gap
		}
		if !at.Before(end) {
			break
		}
		prev = at
	}
	return stalled
}
