package main

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// bakery is the company of the payroll story.
var bakery = demoAccount(4)

// payroll: payroll day. The desk puts the bakery on the payroll tier, whose PIX wait their turns
// on a queue (leaky_bucket) instead of being refused past the limit; its 40 PIX at once go
// through one every window / limit, those past the queue's places are refused at once, and Ana's
// PIX, sent meanwhile, waits no turn: her key is her own.
func payroll(ctx context.Context, d *demo) error {
	if d.desk == "" {
		d.skip("against -target, the tier is set on the deployment's support desk (ADMIN_ADDR), not the demo's")
		return nil
	}
	const office, home = "198.51.100.30", "192.0.2.70"
	company, err := d.login(ctx, office, bakery.document, bakery.password)
	if err != nil {
		return err
	}
	mine, err := d.login(ctx, home, ana.document, ana.password)
	if err != nil {
		return err
	}
	before := d.timedPIX(ctx, home, mine)

	d.out.say("Payday at the bakery. Support puts it on the payroll tier: 60 PIX a window, on a queue of 30 places.")
	moved := d.adminCall(ctx, http.MethodPut, "/admin/v1/accounts/acct-padaria/tier", map[string]any{"tier": "payroll"})
	d.out.say("  desk       PUT    /admin/v1/accounts/acct-padaria/tier  %s", moved.summary())
	if !d.expect("support puts the bakery on the payroll tier", moved.status == http.StatusOK, moved.summary()) {
		return nil
	}
	defer d.adminCall(context.WithoutCancel(ctx), http.MethodPut, "/admin/v1/accounts/acct-padaria/tier", map[string]any{"tier": "pj"})
	if err := d.out.wait(ctx, time.Second, "while every replica reads the new tier (they poll it every half second)"); err != nil {
		return err
	}

	const n = 40
	d.out.say("The bakery sends its payroll: %d PIX of R$ 1,00 at once. Meanwhile Ana sends one of her own (%v alone, before).", n, before.Round(time.Millisecond))
	d.out.say("Each answer is printed as it comes: the refusals at once, then the queue draining, one turn at a time.")
	a := d.sendPayroll(ctx, n, office, company, home, mine)
	replies, hers, during := a.replies, a.hers, a.during
	counts, seen := count(replies)
	limit, window, queue := declaredQueue(replies)
	t := tallyPayroll(a)
	served, slowestRefusal, longestWait, undecided := t.served, t.slowestRefusal, t.longestWait, t.undecided
	if undecided > 0 {
		d.out.say("%d could not be decided within REDIS_TIMEOUT (the embedded Redis, on a busy machine): the PIX's fail mode\n"+
			"refused them, 429 rate_limiter_unavailable (each may still have taken a place nobody waits for). The\n"+
			"queue's own answers are the others; past a quarter undecided, the story proves nothing.", undecided)
	}
	refused := counts[http.StatusTooManyRequests] - undecided
	// The 40 leave together, but a busy machine delivers them over a turn or more, and a turn that
	// passes frees a place: more than Q + 1 may be served then, one more a turn passed before the
	// last was decided, never fewer, and never one refused while the queue had room.
	turns := t.turns(limit, window)
	d.expect(fmt.Sprintf("the queue holds its %d places: at least %d served, at most one more a turn that passed while they came, every 429 a full queue", queue, queue+1),
		queue > 0 && counts[http.StatusCreated] >= min(n, queue+1)-undecided && counts[http.StatusCreated] <= queue+1+turns &&
			counts[http.StatusCreated]+refused+undecided == n && t.fullRefusals == refused && undecided <= n/4,
		fmt.Sprintf("%s; turns passed while they came: %d", seen, turns))
	if len(served) > 2 && limit > 0 {
		pace, want := (served[len(served)-1]-served[0])/time.Duration(len(served)-1), time.Duration(window)*time.Second/time.Duration(limit)
		d.out.say("Served one every %v on average (the tier's pace: %ds over %d), the last after %v; each of the %d\n"+
			"refused was answered within %v of its sending: a full queue says so at once, with Retry-After.",
			pace.Round(time.Millisecond), window, limit, served[len(served)-1].Round(time.Millisecond),
			refused, slowestRefusal.Round(time.Millisecond))
		// Never faster than the pace, judged from the start, when all were sent: between the first
		// and the last answers the span is compressed when the first answers come late (a busy
		// machine delivered the first turns' answers after a second, and the span said 62 ms of 83).
		// As fast as it while the queue stays full (refusals say it was), judged between the
		// answers, which the start's own delay does not stretch.
		fromStart := served[len(served)-1] / time.Duration(len(served)-1)
		d.expect("the queue drains at the tier's pace (within a quarter), and each refusal comes at once",
			fromStart > want*3/4 && (refused == 0 || pace < want*5/4 && slowestRefusal < longestWait/2),
			fmt.Sprintf("pace %v of %v (%v from the start), slowest refusal %v, longest wait %v", pace.Round(time.Millisecond),
				want.Round(time.Millisecond), fromStart.Round(time.Millisecond), slowestRefusal.Round(time.Millisecond),
				longestWait.Round(time.Millisecond)))
	}
	d.expect("each PIX that waited its turn says how long: Server-Timing throttle;dur=ms, within its answer's time", t.waited > 0 && t.unsaid == 0,
		fmt.Sprintf("%d of %d waited, %d said more than they took", t.waited, len(served), t.unsaid))
	// Her key is her own: she waits no turn. (On a busy machine every answer is slower, hers too;
	// what the queue must not do is make her wait for the bakery's turns.)
	d.expect("Ana's PIX, sent meanwhile, waits no turn: her key is her own",
		(hers.status == http.StatusCreated || hers.code() == "rate_limiter_unavailable") && hers.header.Get("Server-Timing") == "" && during < longestWait/2,
		fmt.Sprintf("%s in %v (%v before the payroll), while the bakery's last waited %v", hers.summary(),
			during.Round(time.Millisecond), before.Round(time.Millisecond), longestWait.Round(time.Millisecond)))
	return nil
}

// payrollAnswers are the bakery's PIX's answers (with when each came, since the burst's start, and
// how long each took from its sending), and Ana's, sent meanwhile, with its time.
type payrollAnswers struct {
	replies  []reply
	at, took []time.Duration
	hers     reply
	during   time.Duration
}

// sendPayroll sends n PIX of R$ 1,00 at once from the bakery's token at office, and Ana's from
// home in the middle of the queue, printing each answer as it comes.
func (d *demo) sendPayroll(ctx context.Context, n int, office, company, home, mine string) payrollAnswers {
	start := time.Now()
	type answer struct {
		r    reply
		at   time.Duration
		took time.Duration
		hers bool // Ana's
	}
	answers := make(chan answer, n+1)
	for range n {
		go func() {
			sent := time.Now()
			r := d.pix(ctx, office, company, pixBody("bruno@example.com", 100))
			answers <- answer{r: r, at: time.Since(start), took: time.Since(sent)}
		}()
	}
	go func() {
		time.Sleep(300 * time.Millisecond) // in the middle of the queue
		sent := time.Now()
		r := d.pix(ctx, home, mine, pixBody("bruno@example.com", 100))
		answers <- answer{r: r, took: time.Since(sent), hers: true}
	}()
	out := payrollAnswers{replies: make([]reply, 0, n), at: make([]time.Duration, 0, n), took: make([]time.Duration, 0, n)}
	for range n + 1 {
		a := <-answers // printed here, one at a time, as they come
		d.show(a.r)
		if a.hers {
			out.during, out.hers = a.took, a.r
			continue
		}
		out.replies, out.at, out.took = append(out.replies, a.r), append(out.at, a.at), append(out.took, a.took)
	}
	return out
}

// payrollTally is what the bakery's answers say: when the served came (since the start), the
// slowest refusal and the longest wait (each request's own time, from its sending to its answer),
// how many waited and said so, how many said a wait they cannot have had, the refusals of a full
// queue, the undecided (the fail mode's answers), and by when all were decided.
type payrollTally struct {
	served                      []time.Duration
	slowestRefusal, longestWait time.Duration
	lastDecided                 time.Duration // since the start, by when every one was decided
	waited, unsaid              int
	fullRefusals, undecided     int
}

func tallyPayroll(a payrollAnswers) payrollTally {
	var t payrollTally
	for i, r := range a.replies {
		switch r.status {
		case http.StatusCreated:
			t.served = append(t.served, a.at[i])
			t.longestWait = max(t.longestWait, a.took[i])
			decided := a.at[i] // decided before its wait and its transfer: by its answer less its wait
			if ms, ok := strings.CutPrefix(r.header.Get("Server-Timing"), "throttle;dur="); ok {
				t.waited++
				n, err := strconv.Atoi(ms)
				if err != nil || time.Duration(n)*time.Millisecond > a.took[i] {
					t.unsaid++ // a wait it cannot have had: longer than its whole answer took
				} else {
					decided -= time.Duration(n) * time.Millisecond
				}
			}
			t.lastDecided = max(t.lastDecided, decided)
		case http.StatusTooManyRequests:
			if r.code() == "rate_limiter_unavailable" { // not decided in time: the fail mode's answer, not the queue's
				t.undecided++
				continue
			}
			t.slowestRefusal = max(t.slowestRefusal, a.took[i])
			t.lastDecided = max(t.lastDecided, a.at[i]) // answered at once
			if r.code() == "rate_limit_exceeded" && r.header.Get("RateLimit-Remaining") == "0" &&
				strings.HasPrefix(r.header.Get("RateLimit"), `"pix";`) { // the queue's, not the in-flight limit's
				t.fullRefusals++
			}
		}
	}
	slices.Sort(t.served)
	return t
}

// turns is how many turns of a queue paced limit per window seconds passed before the last PIX
// was decided (the one under way counted).
func (t payrollTally) turns(limit, window int) int {
	if limit <= 0 || window <= 0 {
		return 0
	}
	return int(t.lastDecided*time.Duration(limit)/(time.Duration(window)*time.Second)) + 1
}

// timedPIX sends one PIX of R$ 1,00 from token to Bruno and returns how long its answer took.
func (d *demo) timedPIX(ctx context.Context, ip, token string) time.Duration {
	start := time.Now()
	d.show(d.pix(ctx, ip, token, pixBody("bruno@example.com", 100)))
	return time.Since(start)
}

// declaredQueue is the limit, window (seconds) and places of the queue a reply's RateLimit-Policy
// declares ("pix";q=60;w=5;pixlimit-queue=30), or zeros.
func declaredQueue(replies []reply) (limit, window, places int) {
	for _, r := range replies {
		p, _, _ := strings.Cut(r.header.Get("RateLimit-Policy"), ",")
		if !strings.Contains(p, "pixlimit-queue=") {
			continue
		}
		for _, f := range strings.Split(p, ";")[1:] {
			k, v, _ := strings.Cut(f, "=")
			n, _ := strconv.Atoi(v)
			switch k {
			case "q":
				limit = n
			case "w":
				window = n
			case "pixlimit-queue":
				places = n
			}
		}
		return limit, window, places
	}
	return 0, 0, 0
}
