package httpapi

import (
	"errors"
	"slices"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pixlimit/pixlimit/internal/pix"
	"github.com/pixlimit/pixlimit/internal/ratelimit"
)

// Metrics are the API's Prometheus metrics. Their labels never carry an identity (no CPF,
// account or address): policies, outcomes, route templates, methods, statuses and ledger calls
// are fixed sets, so the cardinality is fixed too.
type Metrics struct {
	decisions       *prometheus.CounterVec
	decisionSeconds *prometheus.HistogramVec
	requests        *prometheus.CounterVec
	requestSeconds  *prometheus.HistogramVec
	ledgerSeconds   *prometheus.HistogramVec
	waitSeconds     *prometheus.HistogramVec
}

// The outcomes of a rate-limit decision, as pixlimit_ratelimit_decisions_total counts them.
const (
	// The values are the contract's: refused_cached (since wave 5; refused_local before) names
	// the deny cache, and "local" names the outage fallback alone (decided_local).
	outcomeAllowed       = "allowed"        // admitted by Redis
	outcomeRefused       = "refused"        // refused by Redis
	outcomeDenyCached    = "refused_cached" // refused by the replica's deny cache, no Redis call
	outcomeFailedOpen    = "failed_open"    // Redis could not decide; served unlimited
	outcomeFailedClosed  = "failed_closed"  // Redis could not decide; refused
	outcomeShadowRefused = "shadow_refused" // refused by a policy in shadow mode; served anyway
	outcomeFallback      = "decided_local"  // Redis could not decide; decided in the replica's memory
	outcomeShed          = "shed"           // a read that gave way to payments (ledger_busy), decided by no one
	outcomeThrottled     = "throttled"      // admitted by a queue, served at its turn
	outcomeAbandoned     = "abandoned"      // admitted by a queue; its client left before its turn
)

// LimiterGauges are what the metrics read of the limiter when scraped.
type LimiterGauges struct {
	// RedisUp reports whether Redis can decide now, asked when scraped (/readyz's probe), not
	// what the last decision found: an idle replica's gauge would keep an outage long over, and
	// miss one that no request met: pixlimit_ratelimit_redis_up.
	RedisUp func() bool
	// WithdrawalsLost counts the admissions that could not be taken back (withdraw.Runner.Lost):
	// pixlimit_ratelimit_withdrawals_lost_total. Nil: none.
	WithdrawalsLost func() int64
}

// NewMetrics registers the API's metrics with reg, reading limiter's gauges when scraped.
func NewMetrics(reg prometheus.Registerer, limiter LimiterGauges) (*Metrics, error) {
	m := &Metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pixlimit_ratelimit_decisions_total",
			Help: "Rate-limit decisions by policy and outcome (allowed, refused, refused_cached, failed_open, failed_closed, shadow_refused, decided_local, throttled, abandoned, shed).",
		}, []string{"policy", "outcome"}),
		decisionSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "pixlimit_ratelimit_decision_seconds",
			Help:    "Time the limiter took to decide, Redis round trip included, by policy (a refusal from a replica's memory of a full key, which asks no one, is not observed).",
			Buckets: []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25},
		}, []string{"policy"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pixlimit_http_requests_total",
			Help: "HTTP requests by route template, method and status.",
		}, []string{"route", "method", "status"}),
		requestSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "pixlimit_http_request_duration_seconds",
			Help:    "HTTP request latency by route template and method.",
			Buckets: prometheus.DefBuckets,
		}, []string{"route", "method"}),
		ledgerSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "pixlimit_ledger_call_seconds",
			Help:    "Ledger call latency by call (account, transfer, statement, lookup, limits, register_device, audit, set_tier, ...) and result (ok, error, unavailable, outcome_unknown).",
			Buckets: prometheus.DefBuckets,
		}, []string{"call", "result"}),
		waitSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "pixlimit_ratelimit_wait_seconds",
			Help:    "Time a queued request (leaky_bucket) waited for its turn, served or abandoned, by policy.",
			Buckets: []float64{.01, .05, .1, .25, .5, 1, 2, 4, 6, 8, 10, 14},
		}, []string{"policy"}),
	}
	up := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "pixlimit_ratelimit_redis_up",
		Help: "1 if Redis runs a decision's script within the budget when scraped (as /readyz asks), else 0.",
	}, func() float64 {
		if limiter.RedisUp() {
			return 1
		}
		return 0
	})
	lost := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "pixlimit_ratelimit_withdrawals_lost_total",
		Help: "Admissions of refused or failed multi-key decisions that could not be taken back: each stays counted until its window passes.",
	}, func() float64 {
		if limiter.WithdrawalsLost == nil {
			return 0
		}
		return float64(limiter.WithdrawalsLost())
	})
	for _, c := range []prometheus.Collector{m.decisions, m.decisionSeconds, m.requests, m.requestSeconds, m.ledgerSeconds, m.waitSeconds, up, lost} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// shed counts a request of policy that gave way to payments before any decision (ledger_busy).
func (m *Metrics) shed(policy string) {
	if m != nil {
		m.decisions.WithLabelValues(policy, outcomeShed).Inc()
	}
}

// waited counts a queued decision over checks, made in took, once its wait ended: served
// (throttled) or abandoned, after waited.
func (m *Metrics) waited(checks []ratelimit.Check, outcome string, took, waited time.Duration) {
	if m == nil {
		return
	}
	m.waitedOnly(checks, waited)
	m.decided(checks, outcome, took)
}

// waitedOnly measures the wait of a queued decision over checks: for waited, and alone for one
// counted under another outcome (decided_local: the fallback's queue).
func (m *Metrics) waitedOnly(checks []ratelimit.Check, waited time.Duration) {
	if m == nil {
		return
	}
	for _, c := range checks {
		m.waitSeconds.WithLabelValues(c.Policy.Name).Observe(waited.Seconds())
	}
}

// decided counts one decision over checks, whose policies share its outcome, and its time.
func (m *Metrics) decided(checks []ratelimit.Check, outcome string, took time.Duration) {
	if m == nil {
		return
	}
	for _, c := range checks {
		m.decisions.WithLabelValues(c.Policy.Name, outcome).Inc()
		if outcome != outcomeDenyCached { // a look-up in memory: the histogram is Redis's decisions'
			m.decisionSeconds.WithLabelValues(c.Policy.Name).Observe(took.Seconds())
		}
	}
}

// refused counts a refusal d of checks decided together (outcome: refused, refused_cached or
// shadow_refused) against the checks whose key refused it, those d gives a RetryAfter: a login
// refused by its IP key is no refusal of its document's, which a dashboard reads as someone
// guessing that account's password, and a look-up refused by the bank's bucket none of the
// payer's. The others admitted nothing and refused nothing, and are not counted. All of checks
// when d does not say which.
func (m *Metrics) refused(checks []ratelimit.Check, d ratelimit.Decision, outcome string, took time.Duration) {
	if m == nil {
		return
	}
	named := len(d.Results) == len(checks) && slices.ContainsFunc(d.Results, func(r ratelimit.Result) bool { return r.RetryAfter > 0 })
	for i := range checks {
		if !named || d.Results[i].RetryAfter > 0 {
			m.decided(checks[i:i+1], outcome, took)
		}
	}
}

// observe counts one request by its route template and method, both from fixed sets (the edge
// middleware maps anything else to "unmatched" and "other"), and its status, with its latency.
// Echo's ecosystem has a Prometheus middleware (echo-contrib/echoprometheus), but its module
// brings a dozen unrelated middlewares' dependencies for what is these few lines, and it labels
// by the request's own method.
func (m *Metrics) observe(route, method string, status int, took time.Duration) {
	if m == nil {
		return
	}
	m.requests.WithLabelValues(route, method, strconv.Itoa(status)).Inc()
	m.requestSeconds.WithLabelValues(route, method).Observe(took.Seconds())
}

// ObserveLedger counts one ledger call, a name from a fixed set, in
// pixlimit_ledger_call_seconds, by how it ended: what pix.Timed reports of every call of the
// replica's one ledger, as its server, its support desk and its tier poller call it.
func (m *Metrics) ObserveLedger(call string, took time.Duration, err error) {
	result := "ok"
	switch {
	case errors.Is(err, pix.ErrUnavailable):
		result = "unavailable"
	case errors.Is(err, pix.ErrOutcomeUnknown), errors.Is(err, pix.ErrChangeOutcomeUnknown):
		result = "outcome_unknown"
	case err != nil:
		result = "error" // a domain answer (insufficient funds, unknown key) is an error here too
	}
	m.ledgerSeconds.WithLabelValues(call, result).Observe(took.Seconds())
}
