// Command demo replays pixlimit's nine stories against a running API and checks what it sees: a
// PIX burst, a distributed login attack, the support desk, a Redis outage, the 2× hole at a
// window's boundary, a key scanner, the night-time value cap, a stolen evening and payroll day.
// With no flags it is self-contained: an embedded
// Redis and two API replicas in this process, built by app.New, with short windows. With -target
// it drives a running deployment instead.
//
// It exits 0 only when every expectation held, and at least one was checked (a story a target
// cannot play is skipped, and said so), so it is a smoke test as much as a lesson.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// go-redis logs every failed dial to its own, process-wide logger: during the outage story a
	// dozen "connection refused" lines that look like the demo failing. They are the library's,
	// so they show with -v, as the replicas' logs do. (Set here, once, before anything dials.)
	libraryLogs := io.Discard
	if slices.ContainsFunc(os.Args[1:], func(a string) bool { return a == "-v" || a == "--v" || a == "-v=true" }) {
		libraryLogs = os.Stderr
	}
	redis.SetLogger(libraryLog{libraryLogs})
	switch err := run(ctx, os.Args, os.Getenv, os.Stdout, os.Stderr); {
	case errors.Is(err, flag.ErrHelp): // -h: the usage was asked for, and printed
	case err != nil:
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

// errFailed means the demo ran and some expectation did not hold.
var errFailed = errors.New("some expectations did not hold")

var scenarios = []struct {
	name, title string
	play        func(context.Context, *demo) error
}{
	{"burst", "PIX burst: the key is the account, not the IP", burst},
	{"login", "Distributed login attack: two keys, one answer", loginAttack},
	{"support", "The support desk: a locked-out customer let in now, not when the window ends", support},
	{"outage", "Redis outage: login and PIX fail closed, the statement is limited in each replica's memory", outage},
	{"hole", "The 2× hole: six algorithms, one boundary", hole},
	{"scan", "Key look-ups: a miss costs twenty times a hit", scan},
	{"night", "The night-time cap: a limit on money, kept by the ledger", night},
	{"evening", "A stolen evening: new devices capped, limits raised only tomorrow, the cap between persons", evening},
	{"payroll", "Payroll day: a company's PIX wait their turns instead of being refused", payroll},
}

// selfContained starts the embedded Redis and two replicas in this process.
func (d *demo) selfContained(redisURL string, passwordCost int, logs io.Writer) (func(), error) {
	if redisURL != "" {
		return nil, errors.New("-redis goes with -target; the self-contained run has its own Redis")
	}
	f, err := startFleet(logs, nightAroundNow(demoEnv), "", passwordCost)
	if err != nil {
		return nil, err
	}
	d.replicas, d.outage, d.limiters, d.breakers, d.caches, d.bank = f.urls, f.redis, f.limiters, f.breakers, f.caches, f.cfg.Limits.LookupParticipant.Policy
	d.watch = make([]replicaWatch, len(f.limiters))
	if len(f.desks) > 0 {
		d.desk, d.adminToken = f.desks[0], f.cfg.AdminToken
	}
	d.lab = redis.NewClient(&redis.Options{Addr: f.redis.mr.Addr()})
	d.out.intro(f.describe())
	return func() { _ = d.lab.Close(); f.close() }, nil
}

// against drives a running deployment: the replicas of target, and with redisURL its Redis.
func (d *demo) against(ctx context.Context, target, redisURL string) (func(), error) {
	for _, u := range strings.Split(target, ",") {
		if u = strings.TrimRight(strings.TrimSpace(u), "/"); u == "" {
			continue
		}
		p, err := url.Parse(u)
		if err != nil {
			return nil, errors.New("-target: a value is no URL: want http://host:port") // the parser's words can quote a password
		}
		if (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" || p.Path != "" || p.RawQuery != "" || p.ForceQuery ||
			p.Fragment != "" || p.User != nil {
			return nil, fmt.Errorf("-target: %q is no replica's base URL: want http://host:port, with no path, query, fragment or user", p.Redacted())
		}
		d.replicas = append(d.replicas, u)
	}
	if len(d.replicas) == 0 {
		return nil, fmt.Errorf("-target %q names no replica: want http://host:port[,http://host:port...]", target)
	}
	d.target = true
	if redisURL == "" {
		d.out.intro(fmt.Sprintf("Driving %s. Without -redis, state left by a run in the last window shows up here.", strings.Join(d.replicas, ", ")))
		return func() {}, nil
	}
	r, err := newRedisControl(ctx, redisURL)
	if err != nil {
		return nil, err
	}
	d.outage = r
	n, err := r.clearLimits(ctx)
	if err != nil {
		r.close()
		return nil, err
	}
	d.out.intro(fmt.Sprintf("Driving %s. Cleared %d rate-limit keys left by earlier runs, so every story starts fresh.", strings.Join(d.replicas, ", "), n))
	if n > 0 {
		// Each replica remembers full keys for up to its deny cache's hold (5 s) without asking
		// Redis, so a key cleared there may still be refused here for that long.
		d.out.intro(fmt.Sprintf("Waiting %v: the replicas' memory of full keys outlives a cleared Redis by at most that.", denyCacheHold))
		select {
		case <-time.After(denyCacheHold):
		case <-ctx.Done():
			r.close()
			return nil, ctx.Err()
		}
	}
	return r.close, nil
}

// denyCacheHold is the longest a replica's deny cache answers for a key (denycache.Options.Hold's
// default).
const denyCacheHold = 5 * time.Second

// options are the demo's flags.
type options struct {
	target, redisURL string
	serve            string // -serve: the live page's address; "": none
	chosen           []int  // indexes into scenarios
	asJSON, verbose  bool
	// passwordCost is the self-contained replicas' bcrypt cost: a real deployment's unless a test
	// sets it (app.Deps.PasswordCost); no flag lowers it.
	passwordCost int
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.target, "target", "", "comma-separated base URLs of running API replicas `URL[,URL...]` (default: start two in this process)")
	fs.StringVar(&o.redisURL, "redis", "", "with -target: the deployment's Redis `URL`, used to pause it for the outage (CLIENT PAUSE) and to clear old limiter state")
	only := fs.String("scenario", "all", "burst, login, support, outage, hole, scan, night, evening, payroll, several with commas, or all")
	fs.BoolVar(&o.asJSON, "json", false, "print the results as JSON on stdout; the narration goes to stderr")
	fs.BoolVar(&o.verbose, "v", false, "show the in-process replicas' logs on stderr")
	fs.StringVar(&o.serve, "serve", "", "also serve the stories as a live picture on `ADDR` (for example 127.0.0.1:8090), and keep serving after them until interrupted")
	if err := fs.Parse(args[1:]); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	wanted := strings.Split(*only, ",")
	slices.Sort(wanted)
	wanted = slices.Compact(wanted) // a story named twice is played once
	for i, s := range scenarios {
		if *only == "all" || slices.Contains(wanted, s.name) {
			o.chosen = append(o.chosen, i)
		}
	}
	if *only != "all" && len(o.chosen) != len(wanted) {
		o.chosen = nil // a name that is no story
	}
	if len(o.chosen) == 0 {
		return o, fmt.Errorf("-scenario %q: want burst, login, support, outage, hole, scan, night, evening, payroll, several with commas, or all", *only)
	}
	return o, nil
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	return play(ctx, o, getenv, stdout, stderr)
}

// play runs the stories o chose and checks them.
func play(ctx context.Context, o options, getenv func(string) string, stdout, stderr io.Writer) error {
	var err error
	narration := stdout
	if o.asJSON {
		narration = stderr
	}
	d := &demo{out: newNarrator(narration, getenv)}
	if o.serve != "" {
		d.out.events = newHub()
		url, stop, err := d.out.events.serve(o.serve)
		if err != nil {
			return err
		}
		defer stop()
		fmt.Fprintf(narration, "The live picture of the stories: %s (open it now: it replays what it missed)\n\n", url)
	}
	logs := io.Discard
	if o.verbose {
		logs = stderr
	}

	var cleanup func()
	if o.target == "" {
		cleanup, err = d.selfContained(o.redisURL, o.passwordCost, logs)
	} else {
		cleanup, err = d.against(ctx, o.target, o.redisURL)
	}
	if err != nil {
		return err
	}
	defer cleanup()
	d.client.Timeout = 10 * time.Second

	for _, i := range o.chosen {
		s := scenarios[i]
		d.scenario, d.out.scenario = s.name, s.name
		d.out.title(s.title)
		if err := s.play(ctx, d); err != nil {
			d.expect("the scenario runs to the end", false, err.Error())
		}
	}

	if len(d.results) == 0 { // every story chosen was skipped: nothing held, nothing was checked
		d.scenario, d.out.scenario = "", ""
		d.expect("the stories chosen check something against this target", false, fmt.Sprintf("%d skipped, none checked", len(d.skipped)))
	}
	d.out.table(d.results)
	for _, s := range d.skipped {
		fmt.Fprintf(narration, "  skipped  %-7s %s\n", s.Scenario, s.Why)
	}
	failed := 0
	for _, r := range d.results {
		if !r.OK {
			failed++
		}
	}
	d.out.events.publish(event{Kind: "done", Text: fmt.Sprintf("%d expectations, %d failed", len(d.results), failed)})
	if o.serve != "" {
		fmt.Fprintln(narration, "\nThe stories are over; the page keeps them. Serving until interrupted (Ctrl-C).")
		<-ctx.Done()
	}
	if o.asJSON {
		if err := writeJSON(stdout, d.results, d.skipped); err != nil {
			return err
		}
	}
	for _, r := range d.results {
		if !r.OK {
			return errFailed
		}
	}
	return nil
}

// libraryLog is go-redis's logger, writing to w.
type libraryLog struct{ w io.Writer }

func (l libraryLog) Printf(_ context.Context, format string, v ...any) {
	fmt.Fprintf(l.w, "redis: "+format+"\n", v...)
}
