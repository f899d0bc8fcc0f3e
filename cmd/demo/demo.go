package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"

	"github.com/pixlimit/pixlimit/client"
	"github.com/pixlimit/pixlimit/internal/dict"
	"github.com/pixlimit/pixlimit/internal/ratelimit"
	"github.com/pixlimit/pixlimit/internal/ratelimit/breaker"
	"github.com/pixlimit/pixlimit/internal/ratelimit/denycache"
)

// demo drives the replicas round robin, one client IP per request through X-Forwarded-For,
// and records what each scenario expected and observed.
type demo struct {
	out      *narrator
	client   http.Client
	replicas []string
	target   bool // the replicas are a deployment's (-target), not this process's
	next     atomic.Uint64
	outage   outageControl // nil when the demo cannot stop Redis
	// lab is where the algorithm lesson (the 2× hole) runs, straight on the limiter: the
	// self-contained fleet's Redis (nil against -target, where the lesson is skipped).
	lab      *redis.Client
	scenario string
	results  []result
	skipped  []skipped // stories that checked nothing against this target
	// limiters are the in-process replicas' (nil against -target): their Stats tell what
	// happened inside, which a client cannot see.
	limiters []*ratelimit.Limiter
	breakers []*breaker.Breaker // each in-process replica's (nil when it has none)
	caches   []*denycache.Cache // each in-process replica's deny cache (nil when it has none)
	// watch is, per in-process replica, who is counting its limiter's calls (watch).
	watch []replicaWatch
	// desk is the in-process fleet's first support desk and adminToken its token ("" against
	// -target: a deployment's desk is not the demo's to use).
	desk, adminToken string
	// bank is the in-process fleet's participant look-up policy (pix-lookup-participant); its
	// bucket's level, which no customer may read, shows what a scan cost the bank.
	bank ratelimit.Policy
	// phones are the device tokens of the customers' own registered phones, by document: a
	// later login of theirs presents it, as their phone would, and is that same device.
	phones map[string]string
}

// bankTokens is how many tokens the bank's DICT look-up bucket holds; ok is false against
// -target.
func (d *demo) bankTokens(ctx context.Context) (tokens int, ok bool) {
	if len(d.limiters) == 0 {
		return 0, false
	}
	ds, err := d.limiters[0].Decide(ctx, ratelimit.AskStep(ratelimit.Check{Policy: d.bank, Identity: dict.ParticipantIdentity}))
	return ds.Last().Worst.Remaining, err == nil
}

// counters are what an in-process replica's limiter, deny cache and breaker did: Redis counts
// the calls that reached Redis (the limiter's, less those its open breaker failed at once).
type counters struct {
	Redis, DenyCached, ShortCircuited int64
	CachedKeys                        int
	BreakerOpen                       bool
}

// counters are the i-th in-process replica's.
func (d *demo) counters(i int) counters {
	s := d.limiters[i].Stats()
	c := counters{Redis: s.Redis}
	if dc := d.caches[i]; dc != nil {
		cs := dc.Stats()
		c.DenyCached, c.CachedKeys = cs.Refused, cs.Keys
	}
	if b := d.breakers[i]; b != nil {
		c.ShortCircuited, c.BreakerOpen = b.ShortCircuited(), b.Open()
		c.Redis -= c.ShortCircuited
	}
	return c
}

// stats sums the in-process replicas' counters; ok is false against -target.
func (d *demo) stats() (sum counters, ok bool) {
	for i := range d.limiters {
		s := d.counters(i)
		sum.Redis += s.Redis
		sum.DenyCached += s.DenyCached
		sum.ShortCircuited += s.ShortCircuited
		sum.CachedKeys += s.CachedKeys
		sum.BreakerOpen = sum.BreakerOpen || s.BreakerOpen
	}
	return sum, len(d.limiters) > 0
}

// outageControl stops and restores the Redis behind the API.
type outageControl interface {
	stop(ctx context.Context) (string, error)
	resume(ctx context.Context) (string, error)
}

// result is one expectation and what was seen.
type result struct {
	Scenario    string `json:"scenario"`
	Expectation string `json:"expectation"`
	Observed    string `json:"observed"`
	OK          bool   `json:"ok"`
}

// expect records an expectation and what was seen, and returns whether it held.
// skip says why the story under way checks nothing against this target, and keeps it for the
// results: a run whose stories were all skipped checked nothing, and is no success.
func (d *demo) skip(format string, args ...any) {
	why := fmt.Sprintf(format, args...)
	d.skipped = append(d.skipped, skipped{d.scenario, why})
	d.out.say("Skipped: %s.", why)
}

// skipped is a story that checked nothing, and why.
type skipped struct {
	Scenario string `json:"scenario"`
	Why      string `json:"why"`
}

func (d *demo) expect(expectation string, ok bool, observed string) bool {
	d.results = append(d.results, result{d.scenario, expectation, observed, ok})
	d.out.verdict(expectation, ok, observed)
	if s, inside := d.stats(); inside {
		d.out.counters(s)
	}
	return ok
}

// reply is one response as the demo sees it.
type reply struct {
	replica int
	ip      string
	who     string // the account (from the token) or the login's document, for the page's key labels
	memory  bool   // its limiter answered without asking Redis (in-process replicas only)
	calls   int    // the Redis calls its limiter made for it; -1 when unknown (-target, or a neighbour's overlapped)
	method  string
	path    string
	status  int
	header  http.Header
	body    map[string]any
	raw     []byte
	err     error
}

// exchange is the request line and the whole answer, as it came: status, every header, body.
func (r reply) exchange() string {
	var b strings.Builder
	fmt.Fprintf(&b, "  %s %s\n  HTTP/1.1 %d %s\n", r.method, r.path, r.status, http.StatusText(r.status))
	for _, k := range slices.Sorted(maps.Keys(r.header)) {
		for _, v := range r.header[k] {
			fmt.Fprintf(&b, "  %s: %s\n", k, v)
		}
	}
	fmt.Fprintf(&b, "\n  %s", strings.TrimSpace(string(r.raw)))
	return b.String()
}

func (r reply) code() string        { s, _ := r.body["error"].(string); return s }
func (r reply) str(k string) string { s, _ := r.body[k].(string); return s }
func (r reply) cents(k string) int64 {
	f, _ := r.body[k].(float64)
	return int64(f)
}

// call sends one request from client IP ip to the next replica, through the API's client
// (package client); headers come in pairs.
func (d *demo) call(ctx context.Context, ip, method, path, token string, body any, headers ...string) reply {
	i := int(d.next.Add(1)-1) % len(d.replicas)
	r := reply{replica: i + 1, ip: ip, method: method, path: path, who: whoSends(token, body)}
	hdrs := []string{"X-Forwarded-For", ip}
	if token != "" {
		hdrs = append(hdrs, "Authorization", "Bearer "+token)
	}
	r.calls = -1
	var w *replicaWatch
	var before counters
	var gen uint64
	alone := false
	if i < len(d.limiters) {
		w = &d.watch[i]
		gen, alone = w.start()
		defer w.end()
		before = d.counters(i)
	}
	resp, err := (&client.Client{BaseURL: d.replicas[i], HTTP: &d.client}).Do(ctx, method, path, body, append(hdrs, headers...)...)
	if err != nil {
		r.err = err
		return r
	}
	if w != nil {
		// What its replica's limiter did meanwhile: its calls to Redis, counted only when no other
		// request was at that replica (a burst's are concurrent, and their calls mix); and
		// whether the deny cache or the open breaker answered it from memory.
		after := d.counters(i)
		if alone && w.started.Load() == gen {
			r.calls = int(max(0, after.Redis-before.Redis)) // a short-circuited heartbeat may land in between
		}
		r.memory = after.Redis == before.Redis && (after.DenyCached > before.DenyCached || after.ShortCircuited > before.ShortCircuited)
	}
	r.status, r.header, r.raw = resp.Status, resp.Header, resp.Body
	_ = json.Unmarshal(r.raw, &r.body)
	return r
}

// replicaWatch tells whether a request had its replica to itself: no other request in flight
// there when it started, and none started until it ended.
type replicaWatch struct {
	started, inflight atomic.Uint64
}

// start notes a request's start: its number, and whether it is the only one in flight.
func (w *replicaWatch) start() (gen uint64, alone bool) {
	return w.started.Add(1), w.inflight.Add(1) == 1
}

func (w *replicaWatch) end() { w.inflight.Add(^uint64(0)) }

// whoSends names the sender of a request for the page: the account its access token names (read,
// not verified: a label, never a decision), or the document a login presents, or "".
func whoSends(token string, body any) string {
	if m, ok := body.(map[string]string); ok && m["document"] != "" {
		return m["document"]
	}
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return ""
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return ""
	}
	var claims struct {
		Sub string `json:"sub"`
	}
	_ = json.Unmarshal(payload, &claims)
	return claims.Sub
}

// show prints one request as a line.
func (d *demo) show(r reply) reply {
	d.out.request(r)
	return r
}

// burst sends n requests at once and prints them in order.
func (d *demo) burst(n int, send func(i int) reply) []reply {
	replies := make([]reply, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { replies[i] = send(i) })
	}
	wg.Wait()
	for _, r := range replies {
		d.show(r)
	}
	return replies
}

// login returns an access token, or an error saying what happened instead.
func (d *demo) login(ctx context.Context, ip, document, password string) (string, error) {
	r := d.show(d.call(ctx, ip, "POST", "/v1/login", "", map[string]string{"document": document, "password": password}))
	if r.status != http.StatusOK {
		hint := ""
		if d.target && r.code() == "invalid_credentials" {
			hint = " (does the deployment hold the demo accounts? DEMO_ACCOUNTS=true, a lab's only)"
		}
		return "", fmt.Errorf("login %s from %s: %s%s", document, ip, r.summary(), hint)
	}
	return r.str("access_token"), nil
}

func (d *demo) balance(ctx context.Context, ip, token string) (int64, error) {
	r := d.call(ctx, ip, "GET", "/v1/statement?limit=1", token, nil)
	if r.status != http.StatusOK {
		return 0, fmt.Errorf("statement: %s", r.summary())
	}
	return r.cents("balance_cents"), nil
}

func (r reply) summary() string {
	if r.err != nil {
		return r.err.Error()
	}
	if c := r.code(); c != "" {
		return fmt.Sprintf("%d %s", r.status, c)
	}
	return fmt.Sprint(r.status)
}

// count tallies statuses: "10 × 201, 5 × 429".
func count(replies []reply) (map[int]int, string) {
	n := map[int]int{}
	var order []int
	for _, r := range replies {
		if n[r.status] == 0 {
			order = append(order, r.status)
		}
		n[r.status]++
	}
	parts := make([]string, len(order))
	for i, s := range order {
		label := fmt.Sprint(s)
		if s == 0 {
			label = "no answer"
		}
		parts[i] = fmt.Sprintf("%d × %s", n[s], label)
	}
	return n, strings.Join(parts, ", ")
}

// narrator writes the story; colour only on a terminal, and never with NO_COLOR set.
type narrator struct {
	w      io.Writer
	colour bool
	// events, when set (-serve), receives every line as an event, for the page to draw;
	// scenario is the story being told.
	events   *hub
	scenario string
}

func newNarrator(w io.Writer, getenv func(string) string) *narrator {
	n := &narrator{w: w}
	if f, ok := w.(*os.File); ok && getenv("NO_COLOR") == "" && getenv("TERM") != "dumb" {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			n.colour = true
		}
	}
	return n
}

func (n *narrator) paint(code, s string) string {
	if !n.colour {
		return s
	}
	return "\x1b[" + code + "m" + s + "\x1b[0m"
}

func (n *narrator) intro(s string) {
	fmt.Fprintf(n.w, "%s\n", n.paint("1", s))
	n.events.publish(event{Kind: "intro", Text: s})
}

func (n *narrator) title(s string) {
	fmt.Fprintf(n.w, "\n%s\n", n.paint("1;36", "== "+s+" =="))
	n.events.publish(event{Kind: "title", Scenario: n.scenario, Text: s})
}

func (n *narrator) say(format string, args ...any) {
	text := fmt.Sprintf(format, args...)
	fmt.Fprintf(n.w, "\n%s\n", text)
	n.events.publish(event{Kind: "say", Scenario: n.scenario, Text: text})
}

// decision records one request of the algorithm lesson (the terminal draws them as timelines).
func (n *narrator) decision(a, phase string, allowed bool) {
	n.events.publish(event{Kind: "decision", Scenario: n.scenario, Algorithm: a, Phase: phase, Allowed: allowed})
}

// counters records the in-process limiters' counters, for the page's costs.
func (n *narrator) counters(s counters) {
	n.events.publish(event{Kind: "stats", Scenario: n.scenario, RedisCalls: s.Redis, DenyCached: s.DenyCached, BreakerOpen: s.BreakerOpen})
}

func (n *narrator) request(r reply) {
	status := r.summary()
	switch {
	case r.status >= 200 && r.status < 300:
		status = n.paint("32", status)
	case r.status == http.StatusTooManyRequests:
		status = n.paint("33", status)
	default:
		status = n.paint("31", status)
	}
	dash := func(s string) string {
		if s == "" {
			return "-"
		}
		return s
	}
	calls := "-"
	var scripts *int
	if r.calls >= 0 {
		calls, scripts = strconv.Itoa(r.calls), &r.calls
	}
	waited, queued := strings.CutPrefix(r.header.Get("Server-Timing"), "throttle;dur=") // a queue's turn
	turn := ""
	if queued {
		turn = "  waited " + waited + " ms"
	}
	fmt.Fprintf(n.w, "  replica %d  %-15s  %-4s %-22s  %-32s  remaining %-3s  retry-after %-3s  redis calls %s%s\n",
		r.replica, r.ip, r.method, r.path, status, dash(r.header.Get("RateLimit-Remaining")), dash(r.header.Get("Retry-After")), calls, turn)
	n.events.publish(event{Kind: "call", Scenario: n.scenario, Replica: r.replica, IP: r.ip, Who: r.who, Memory: r.memory, Scripts: scripts, Method: r.method, Path: r.path,
		Status: r.status, Code: r.code(), Remaining: r.header.Get("RateLimit-Remaining"), RetryAfter: r.header.Get("Retry-After"),
		Policy: r.header.Get("RateLimit-Policy"), Worst: worstKey(r.header.Get("RateLimit")), Waited: waited, Text: r.summary()})
}

// worstKey is the policy a RateLimit header names (`"pix";r=0;t=42`): the key the answer
// reports, and of a 429 the one that refused.
func worstKey(rateLimit string) string {
	name, _, _ := strings.Cut(rateLimit, ";")
	return strings.Trim(name, `" `)
}

func (n *narrator) verdict(expectation string, ok bool, observed string) {
	mark := n.paint("32", "  ✔ ")
	if !ok {
		mark = n.paint("31", "  ✘ ")
	}
	fmt.Fprintf(n.w, "%s%s — saw %s\n", mark, expectation, observed)
	n.events.publish(event{Kind: "verdict", Scenario: n.scenario, Text: expectation, OK: ok, Observed: observed})
}

func (n *narrator) wait(ctx context.Context, d time.Duration, why string) error {
	fmt.Fprintf(n.w, "\n  … waiting %v %s\n", d, why)
	n.events.publish(event{Kind: "wait", Scenario: n.scenario, Text: fmt.Sprintf("waiting %v %s", d, why)})
	select {
	case <-time.After(d):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (n *narrator) table(results []result) {
	fmt.Fprintf(n.w, "\n%s\n", n.paint("1", "Expectations"))
	failed, width := 0, 0
	for _, r := range results {
		width = max(width, utf8.RuneCountInString(r.Expectation))
	}
	for _, r := range results {
		mark := n.paint("32", "ok  ")
		if !r.OK {
			mark = n.paint("31", "FAIL")
			failed++
		}
		pad := strings.Repeat(" ", width-utf8.RuneCountInString(r.Expectation))
		fmt.Fprintf(n.w, "  %s  %-7s %s%s  %s\n", mark, r.Scenario, r.Expectation, pad, r.Observed)
	}
	if failed == 0 {
		fmt.Fprintf(n.w, "\n%s\n", n.paint("1;32", fmt.Sprintf("All %d expectations held.", len(results))))
	} else {
		fmt.Fprintf(n.w, "\n%s\n", n.paint("1;31", fmt.Sprintf("%d of %d expectations did not hold.", failed, len(results))))
	}
}

func writeJSON(w io.Writer, results []result, skips []skipped) error {
	ok := true
	for _, r := range results {
		ok = ok && r.OK
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(struct {
		OK      bool      `json:"ok"`
		Results []result  `json:"results"`
		Skipped []skipped `json:"skipped,omitempty"`
	}{ok, results, skips})
}
