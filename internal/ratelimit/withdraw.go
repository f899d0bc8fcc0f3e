package ratelimit

import (
	"context"
	"errors"
	"net"
	"time"
)

// withdraw takes back one admission in the background, within its own budget: the cluster path's
// admission in a key whose sibling refused (see decideApart).
func (l *Limiter) withdraw(a Algorithm, key string, c call, at int64, decided time.Time) {
	l.withdrawals.Add(1)
	go func() {
		defer l.withdrawals.Done()
		if _, err := l.runWithdrawal(a, key, c.withdrawal(at, l.clockArg())); err != nil {
			// The admission stays counted until its window passes: stricter, never looser.
			l.logger.Warn("rate limiter could not withdraw an admission", "algorithm", a, "cause", err.Error())
			return
		}
		if l.withdrawn != nil {
			l.withdrawn(time.Since(decided))
		}
	}()
}

// lateRetries are the waits before each attempt to withdraw a decision that came back too late:
// the script may still be queued behind whatever made Redis slow, and may run after an attempt
// that found nothing, so the attempts spread over a few seconds. After the last one, an
// admission that Redis recorded even later stays counted until it leaves its window.
var lateRetries = [...]time.Duration{0, 100 * time.Millisecond, 500 * time.Millisecond, 2 * time.Second}

// maxLateWithdrawals bounds the withdrawals of late decisions in flight; during an outage every
// decision is late, and the goroutines must not pile up.
const maxLateWithdrawals = 256

// withdrawLate takes back, in the background, a request whose decision did not come back within
// the budget (args are the decision's). The caller answered it as unavailable, yet Redis may
// still have run the script, then or later, and recorded it. With the sliding log each attempt
// removes the request's own entry by its id: exact, and harmless if the script refused it or
// never ran. The other algorithms keep counts, not requests, and cannot tell whether this request
// was counted, so giving one back could admit past the limit: their late admissions stay counted
// until they leave the window, the strict side.
func (l *Limiter) withdrawLate(a Algorithm, keys []string, c call, cause error) {
	if a != SlidingLog || !mayHaveRun(cause) {
		return
	}
	select {
	case l.late <- struct{}{}:
	default:
		l.logger.Debug("rate limiter: too many late decisions to withdraw; this one stays counted")
		return
	}
	l.withdrawals.Add(1)
	go func() {
		defer func() { <-l.late; l.withdrawals.Done() }()
		var err error
		for _, wait := range lateRetries {
			select { // after Close, the remaining attempts run at once: shutdown does not wait the backoff
			case <-time.After(wait):
			case <-l.closing:
			}
			removed := int64(0)
			for i, key := range keys { // one key per call: on a cluster they live apart
				var n int64
				n, err = l.runWithdrawal(a, key, c.only(i).withdrawal(0, l.clockArg()))
				removed += n
			}
			if removed > 0 {
				l.logger.Debug("rate limiter withdrew a late decision", "keys", removed)
				return
			}
		}
		if err != nil {
			l.logger.Warn("rate limiter could not withdraw a late decision; it may stay counted until its window passes",
				"cause", err.Error())
		}
	}()
}

// mayHaveRun reports whether a failed call may still have reached Redis: it timed out or was
// cancelled after being sent. A refused connection sent nothing.
func mayHaveRun(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) ||
		errors.As(err, &ne) && ne.Timeout()
}

// Close waits for the withdrawals and the breaker's probe in flight, each now a few attempts of
// one budget, made at once rather than over the backoff.
// The Limiter must not be used after Close; the Redis client stays the caller's to close.
func (l *Limiter) Close() error {
	l.closeOnce.Do(func() { close(l.closing) })
	l.withdrawals.Wait()
	if l.breaker != nil {
		l.breaker.stop()
	}
	return nil
}
