package main

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pixlimit/pixlimit/client"
	"github.com/pixlimit/pixlimit/internal/pix"
)

// maxStoryLimit is the largest limit a story can show: a burst of limit+5 requests must stay
// readable, and within the demo accounts' balances.
const maxStoryLimit = 50

// account is a demo account as a customer knows it.
type account struct{ document, password string }

// The contract's demo accounts (client.DemoAccounts), by name.
var ana, bruno, carla, diego = demoAccount(0), demoAccount(1), demoAccount(2), demoAccount(3)

func demoAccount(i int) account {
	a := client.DemoAccounts()[i]
	return account{a.Document, a.Password}
}

// pix sends one PIX from client IP ip under a fresh Idempotency-Key, which the API requires: a
// client that names each transfer can retry any failure without paying twice.
func (d *demo) pix(ctx context.Context, ip, token string, body map[string]any) reply {
	return d.call(ctx, ip, "POST", "/v1/pix", token, body, "Idempotency-Key", client.NewIdempotencyKey())
}

func pixBody(key string, cents int64) map[string]any {
	return map[string]any{"key": key, "amount_cents": cents, "description": "pixlimit demo"}
}

// burst: one office, one IP, three customers. Ana's burst is cut at her account's limit;
// her colleagues are untouched; only admitted transfers move money; Retry-After is honest. The
// limit is the deployment's own, read from the RateLimit-Policy of Ana's first PIX.
func burst(ctx context.Context, d *demo) error {
	const office = "198.51.100.10"
	d.out.say("Ana, Bruno and Diego work in one office: all their requests leave through one IP, %s.", office)
	tokens := map[string]string{}
	for _, who := range []account{ana, bruno, diego} {
		t, err := d.login(ctx, office, who.document, who.password)
		if err != nil {
			return err
		}
		tokens[who.document] = t
	}
	anaToken := tokens[ana.document]
	before, err := d.balance(ctx, office, anaToken)
	if err != nil {
		return err
	}

	d.out.say("Ana (balance %s) sends a PIX of R$ 15,00 to Bruno; its answer declares the limit.", pix.BRL(before))
	first := d.show(d.pix(ctx, office, anaToken, pixBody("bruno@example.com", 1500)))
	limit, ok := declaredLimit(first.header, "pix")
	if !d.expect("the PIX answer declares its limit in RateLimit-Policy", ok, first.header.Get("RateLimit-Policy")) {
		return nil
	}
	if !d.expect(fmt.Sprintf("the PIX limit is small enough to show a burst (at most %d)", maxStoryLimit),
		limit <= maxStoryLimit, fmt.Sprintf("%d", limit)) {
		return nil
	}
	n := limit + 4
	d.out.say("Then %d more at once, alternating replicas: %d in all, 5 past her limit of %d. They are concurrent:\n"+
		"each line's remaining is what Redis said to that request, and the lines come in the order the answers\n"+
		"came back, not the order Redis decided them.", n, n+1, limit)
	replies := append([]reply{first}, d.burst(n, func(int) reply {
		return d.pix(ctx, office, anaToken, pixBody("bruno@example.com", 1500))
	})...)
	d.resendOverlapping(replies, func() reply { return d.pix(ctx, office, anaToken, pixBody("bruno@example.com", 1500)) })
	counts, seen := count(replies)
	d.expect(fmt.Sprintf("%d PIX: %d × 201, 5 × 429", n+1, limit),
		counts[http.StatusCreated] == limit && counts[http.StatusTooManyRequests] == 5, seen)
	wait, honest, codes := retryAfter(replies)
	d.expect("every 429 says rate_limit_exceeded and carries Retry-After", honest, fmt.Sprintf("%s; Retry-After up to %ds", codes, wait))
	for _, r := range replies {
		if r.status == http.StatusTooManyRequests {
			d.out.say("One of the refusals, as it came:\n%s", r.exchange())
			break
		}
	}

	d.out.say("Bruno and Diego, behind the same IP, each send R$ 1,00 to Carla while Ana is blocked.")
	b := d.show(d.pix(ctx, office, tokens[bruno.document], pixBody("carla@example.com", 100)))
	c := d.show(d.pix(ctx, office, tokens[diego.document], pixBody("carla@example.com", 100)))
	d.expect("Bruno and Diego are unaffected: the key is the account, not the IP",
		b.status == http.StatusCreated && c.status == http.StatusCreated, b.summary()+", "+c.summary())

	after, err := d.balance(ctx, office, anaToken)
	if err != nil {
		return err
	}
	moved := before - after
	d.out.say("Ana's balance: %s before, %s after.", pix.BRL(before), pix.BRL(after))
	d.expect("only the admitted PIX moved money", moved == int64(counts[http.StatusCreated])*1500,
		fmt.Sprintf("%s moved for %d × 201", pix.BRL(moved), counts[http.StatusCreated]))

	if wait == 0 {
		return nil
	}
	if err := d.out.wait(ctx, time.Duration(wait)*time.Second, "(the Retry-After she was given), then Ana sends again"); err != nil {
		return err
	}
	r := d.show(d.pix(ctx, office, anaToken, pixBody("bruno@example.com", 1500)))
	d.expect("after Retry-After, Ana's next PIX is admitted", r.status == http.StatusCreated, r.summary())
	return nil
}

// resendOverlapping sends again, one at a time with send, the PIX of replies that the in-flight
// limit refused (PIX_CONCURRENCY, 2 by default: PIX of one account that overlap, refused before
// the rate limit counts them), as a client would after their Retry-After of a second, so that a
// burst shows what the rate limit decides; their new answers take their places.
func (d *demo) resendOverlapping(replies []reply, send func() reply) {
	again := 0
	for i, r := range replies {
		if r.status == http.StatusTooManyRequests && strings.Contains(r.header.Get("RateLimit-Policy"), `"pix-concurrency"`) {
			again++
			replies[i] = d.show(send())
		}
	}
	if again > 0 {
		d.out.say("%d of them found two of her PIX still in progress (pix-concurrency, 429, Retry-After: 1) and were sent again, one at a time.", again)
	}
}

// retryAfter is the longest Retry-After among the 429s of replies, in seconds, and whether
// there were some and each said rate_limit_exceeded with a Retry-After of at least 1.
func retryAfter(replies []reply) (wait int, honest bool, seen string) {
	refused, honest := 0, true
	codes := map[string]int{}
	for _, r := range replies {
		if r.status != http.StatusTooManyRequests {
			continue
		}
		refused++
		s, err := strconv.Atoi(r.header.Get("Retry-After"))
		ok := err == nil && s >= 1 && r.code() == "rate_limit_exceeded"
		honest = honest && ok
		wait = max(wait, s)
		what := r.code()
		if err != nil || s < 1 {
			what += " without Retry-After"
		}
		codes[what]++
	}
	var parts []string
	for _, code := range slices.Sorted(maps.Keys(codes)) {
		parts = append(parts, fmt.Sprintf("%d × %s", codes[code], code))
	}
	return wait, honest && refused > 0, strings.Join(parts, ", ")
}

// declaredLimit reads policy's capacity from a RateLimit-Policy header such as
// `"login-ip";q=10;w=600, "login-account";q=5;w=600`: its burst when it has one
// (`;pixlimit-burst=N`, `;burst=N` before wave 3), else q.
func declaredLimit(h http.Header, policy string) (int, bool) {
	for _, item := range strings.Split(h.Get("RateLimit-Policy"), ",") {
		params := strings.Split(strings.TrimSpace(item), ";")
		if params[0] != strconv.Quote(policy) {
			continue
		}
		limit := 0
		for _, p := range params[1:] {
			if k, v, _ := strings.Cut(p, "="); k == "q" && limit == 0 || k == "pixlimit-burst" || k == "burst" {
				limit, _ = strconv.Atoi(v)
			}
		}
		return limit, limit > 0
	}
	return 0, false
}

// loginAttack: a botnet spreads guesses over many IPs, so only the document key stops it, and
// the owner of the attacked account is locked out too, except on a device she used before; one
// IP spreads guesses over many documents, so only the IP key stops it; both refusals look the
// same.
func loginAttack(ctx context.Context, d *demo) error {
	before, inside := d.stats()
	d.out.say("Yesterday Carla logged in on her phone; the answer gave the phone a device token, which it keeps.")
	yesterday := d.show(d.call(ctx, "192.0.2.50", "POST", "/v1/login", "", map[string]string{"document": carla.document, "password": carla.password}))
	phone := yesterday.str("device_token")
	if !d.expect("a successful login hands the device a device token", yesterday.status == http.StatusOK && phone != "", yesterday.summary()) {
		return nil
	}
	d.out.say("Today a botnet of 20 machines tries passwords for Carla's document, one guess from each IP.")
	var bots []reply
	for i := range 20 {
		ip := fmt.Sprintf("203.0.113.%d", i+1)
		bots = append(bots, d.show(d.call(ctx, ip, "POST", "/v1/login", "",
			map[string]string{"document": carla.document, "password": fmt.Sprintf("guess-%d", i+1)})))
	}
	// Each bot is an IP of its own only if the deployment believes the demo's X-Forwarded-For:
	// else its IP key (the one a 401 reports) counts every bot's guess, and the story cannot be
	// told; say which setting, rather than fail below for a reason nobody can see.
	if first, second := bots[0].header.Get("RateLimit-Remaining"), bots[1].header.Get("RateLimit-Remaining"); !d.expect(
		"the deployment takes the demo's X-Forwarded-For as the client (TRUSTED_PROXIES covers it): each bot has an IP key of its own",
		bots[0].status != http.StatusUnauthorized || bots[1].status != http.StatusUnauthorized || first == second,
		fmt.Sprintf("two bots' IP key: %s, then %s remaining", first, second)) {
		return nil
	}
	// The refusal lists every key decided: it declares the document key's limit, of which
	// Carla's own login yesterday took one.
	limit, _ := declaredLimit(bots[len(bots)-1].header, "login-account")
	guesses := limit - 1
	d.expect(fmt.Sprintf("20 IPs, one guess each: %d × 401 (the document key's limit, less Carla's login), then 429", guesses),
		guesses > 0 && inOrder(bots, guesses, http.StatusUnauthorized, http.StatusTooManyRequests), sequence(bots))

	d.out.say("During the attack Carla logs in, with her password, on a new laptop.")
	r := d.show(d.call(ctx, "192.0.2.55", "POST", "/v1/login", "", map[string]string{"document": carla.document, "password": carla.password}))
	d.expect("from a new device Carla is refused too: the document key is full", r.status == http.StatusTooManyRequests, r.summary())
	d.out.say("Then on her phone, which presents its device token: the login counts against the phone's own key.")
	onPhone := d.show(d.call(ctx, "192.0.2.56", "POST", "/v1/login", "", map[string]string{"document": carla.document, "password": carla.password},
		"Device-Token", phone))
	d.expect("on her trusted phone Carla gets in: the botnet cannot lock her out", onPhone.status == http.StatusOK, onPhone.summary())

	const single = "198.51.100.66"
	first := d.show(d.call(ctx, single, "POST", "/v1/login", "", map[string]string{"document": sweepCPF(0), "password": "123456"}))
	perIP, ok := declaredLimit(first.header, "login-ip")
	if !d.expect(fmt.Sprintf("the login declares its IP key's limit, small enough for the story (at most %d)", maxStoryLimit),
		ok && perIP <= maxStoryLimit, first.header.Get("RateLimit-Policy")) {
		return nil
	}
	d.out.say("One machine, %s, tries %d different documents, one guess each (that was the first).", single, perIP+5)
	sweep := []reply{first}
	for i := 1; i < perIP+5; i++ {
		sweep = append(sweep, d.show(d.call(ctx, single, "POST", "/v1/login", "",
			map[string]string{"document": sweepCPF(i), "password": "123456"})))
	}
	d.expect(fmt.Sprintf("one IP, %d documents: %d × 401, then 429 from the IP key", perIP+5, perIP),
		inOrder(sweep, perIP, http.StatusUnauthorized, http.StatusTooManyRequests), sequence(sweep))

	byDoc, byIP := bots[len(bots)-1], sweep[len(sweep)-1]
	same := byDoc.status == http.StatusTooManyRequests && byDoc.status == byIP.status && byDoc.code() == byIP.code() &&
		byDoc.str("message") == byIP.str("message") && slices.Equal(slices.Sorted(maps.Keys(byDoc.header)), slices.Sorted(maps.Keys(byIP.header))) &&
		worstKey(byDoc.header.Get("RateLimit")) == "login-account" && worstKey(byIP.header.Get("RateLimit")) == "login-ip"
	d.expect("refused by the document key or by the IP key: 429 both, the same status, body and header names, the values naming the key", same,
		fmt.Sprintf("%s (%s) vs %s (%s)", byDoc.summary(), worstKey(byDoc.header.Get("RateLimit")), byIP.summary(), worstKey(byIP.header.Get("RateLimit"))))

	if inside {
		d.reportCachedRefusals(before, append(append(bots, sweep...), r))
	}
	d.out.say("The document key is what stops a botnet that never reuses an IP; alone, it would let that botnet lock\n" +
		"the owner out. Device tokens (OWASP's device cookies) give each device she used before a key of its\n" +
		"own: a stolen one buys an attacker one device's five guesses, not her account.")
	return nil
}

// reportCachedRefusals says how many of the refusals among replies the in-process replicas'
// deny caches answered since before.
func (d *demo) reportCachedRefusals(before counters, replies []reply) {
	after, _ := d.stats()
	refused := 0
	for _, r := range replies {
		if r.status == http.StatusTooManyRequests {
			refused++
		}
	}
	cached := int(after.DenyCached - before.DenyCached)
	d.out.say("Inside the replicas: %d of the %d refusals were answered from the replica's own memory of a full key,\n"+
		"with no Redis call; the replicas called Redis %d times. A replica asks Redis to learn that a key is full,\n"+
		"then again at most every 5 s while it stays full.", cached, refused, after.Redis-before.Redis)
	d.expect("most refusals cost no Redis call: the replicas remember full keys",
		2*cached > refused, fmt.Sprintf("%d of %d refusals answered by the deny cache", cached, refused))
}

// sweepCPF is the i-th document of the one-IP sweep: valid CPFs that no demo account has.
func sweepCPF(i int) string {
	doc, _ := pix.CompleteCPF(strconv.Itoa(700000000 + i*7919))
	return doc
}

// outage: with Redis gone, login and PIX fail closed, the statement is decided in each replica's
// memory at its share of the limit, nothing waits
// past the budget, and limiting resumes by itself.
func outage(ctx context.Context, d *demo) (err error) {
	if d.outage == nil {
		d.skip("the outage needs the deployment's Redis to pause: give -redis URL, a lab's only")
		return nil
	}
	const ip = "192.0.2.80"
	token, err := d.login(ctx, ip, ana.document, ana.password)
	if err != nil {
		return err
	}
	before, err := d.balance(ctx, ip, token)
	if err != nil {
		return err
	}
	full, _ := declaredLimit(d.call(ctx, ip, "GET", "/v1/statement?limit=1", token, nil).header, "statement")
	what, err := d.outage.stop(ctx)
	if err != nil {
		return err
	}
	resumed := false
	defer func() {
		if !resumed {
			_, _ = d.outage.resume(context.WithoutCancel(ctx))
		}
	}()
	d.out.say("Redis goes away: %s.", what)

	l := d.show(d.call(ctx, ip, "POST", "/v1/login", "", map[string]string{"document": diego.document, "password": diego.password}))
	d.expect("login fails closed: 429 rate_limiter_unavailable, password not even checked",
		l.status == http.StatusTooManyRequests && l.code() == "rate_limiter_unavailable" && l.header.Get("Retry-After") != "", l.summary())
	p := d.show(d.pix(ctx, ip, token, pixBody("bruno@example.com", 1500)))
	d.expect("PIX fails closed: 429 rate_limiter_unavailable",
		p.status == http.StatusTooManyRequests && p.code() == "rate_limiter_unavailable", p.summary())
	s := d.show(d.call(ctx, ip, "GET", "/v1/statement?limit=1", token, nil))
	d.openBreakers(ctx, ip, token)
	share, _ := declaredLimit(s.header, "statement")
	// Behind a proxy the demo cannot count the replicas; the share tells: ⌈limit / share⌉ of them.
	fleet := 1
	if share > 0 {
		fleet = (full + share - 1) / share
	}
	d.expect(fmt.Sprintf("statement decided in the replica's memory: 200, its share of the limit (%d of %d, a fleet of %d) in RateLimit-Policy", share, full, fleet),
		s.status == http.StatusOK && share > 0 && share < full, fmt.Sprintf("%s, RateLimit-Policy %s", s.summary(), s.header.Get("RateLimit-Policy")))
	moved := fmt.Sprintf("balance %s, was %s", pix.BRL(s.cents("balance_cents")), pix.BRL(before))
	if s.status != http.StatusOK {
		moved = "the balance could not be read: " + s.summary()
	}
	d.expect("the refused PIX moved no money", s.status == http.StatusOK && s.cents("balance_cents") == before, moved)
	d.out.say("%d more statements, more than the fleet's %d shares hold:", share*fleet+2, fleet)
	var local []reply
	for range share*fleet + 2 {
		local = append(local, d.call(ctx, ip, "GET", "/v1/statement?limit=1", token, nil))
	}
	counts, seen := count(local)
	_, honest, _ := retryAfter(local)
	d.expect(fmt.Sprintf("past the shares the fleet refuses, 429 rate_limit_exceeded with Retry-After: at most %d × %d admitted", share, fleet),
		counts[http.StatusTooManyRequests] > 0 && honest && counts[http.StatusOK] <= share*fleet, seen)

	what, err = d.outage.resume(ctx)
	if err != nil {
		return err
	}
	resumed = true
	d.out.say("Redis returns: %s.", what)
	d.awaitLimiting(ctx, ip, token, full, fleet)
	p = d.show(d.pix(ctx, ip, token, pixBody("bruno@example.com", 1500)))
	l = d.show(d.call(ctx, ip, "POST", "/v1/login", "", map[string]string{"document": diego.document, "password": diego.password}))
	d.expect("back to normal, no restart: PIX 201 and login 200, with RateLimit headers",
		p.status == http.StatusCreated && l.status == http.StatusOK && p.header.Get("RateLimit-Remaining") != "" && l.header.Get("RateLimit-Remaining") != "",
		p.summary()+", "+l.summary())
	return nil
}

// awaitLimiting waits, up to 10 s, until Redis decides again on every replica of a fleet of
// fleet, its statements declaring the whole limit full again, and says how long it took.
func (d *demo) awaitLimiting(ctx context.Context, ip, token string, full, fleet int) {
	start := time.Now()
	// Every replica in turn: the demo alternates its targets, but behind one proxy's address it
	// cannot pick a replica, so it asks for twice the fleet's size of Redis's decisions in a row
	// (a round-robin proxy spreads them over every replica); one success there could be one
	// replica's while another's breaker still waits out its cool-down.
	for decided := 0; decided < max(len(d.replicas), 2*fleet) && time.Since(start) < 10*time.Second; {
		r := d.call(ctx, ip, "GET", "/v1/statement?limit=1", token, nil)
		if q, ok := declaredLimit(r.header, "statement"); ok && q == full { // Redis's decision: the whole limit
			decided++
			continue
		}
		decided = 0
		time.Sleep(100 * time.Millisecond)
	}
	d.out.say("Limiting resumed %v after Redis returned (an open breaker waits out its cool-down, then probes).",
		time.Since(start).Round(10*time.Millisecond))
	if st, ok := d.stats(); ok {
		d.expect("the breaker closed again", !st.BreakerOpen, fmt.Sprintf("open=%v", st.BreakerOpen))
	}
}

// openBreakers sends statements into the outage until each in-process replica's breaker opens
// (nothing to see from outside against -target).
func (d *demo) openBreakers(ctx context.Context, ip, token string) {
	before, ok := d.stats()
	if !ok {
		return
	}
	d.out.say("Ten more statements: after 5 failures in a row, each replica's circuit breaker opens and\n" +
		"stops asking Redis for a second, so the fail mode answers at once instead of after the Redis timeout.")
	for range 10 {
		d.show(d.call(ctx, ip, "GET", "/v1/statement?limit=1", token, nil))
	}
	after, _ := d.stats()
	open, breakers := 0, 0
	for i := range d.limiters {
		if d.breakers[i] != nil {
			breakers++
			if d.counters(i).BreakerOpen {
				open++
			}
		}
	}
	d.expect("each replica's breaker opens: decisions fail at once, without asking Redis", breakers > 0 && open == breakers && after.ShortCircuited > before.ShortCircuited,
		fmt.Sprintf("%d of %d open, %d decisions short-circuited", open, breakers, after.ShortCircuited-before.ShortCircuited))
}

// inOrder reports whether the first n replies have status first and the rest status then.
func inOrder(replies []reply, n, first, then int) bool {
	for i, r := range replies {
		if (i < n && r.status != first) || (i >= n && r.status != then) {
			return false
		}
	}
	return len(replies) > n
}

// sequence shows statuses as runs: "5 × 401, then 15 × 429".
func sequence(replies []reply) string {
	var parts []string
	for i := 0; i < len(replies); {
		j := i
		for j < len(replies) && replies[j].status == replies[i].status {
			j++
		}
		parts = append(parts, fmt.Sprintf("%d × %s", j-i, replies[i].summary()))
		i = j
	}
	return strings.Join(parts, ", then ")
}

// support: a botnet fills Carla's document key; her new laptop is refused; support reads the
// key's state on the desk and clears it on every replica; the laptop gets in at once. Then the
// laptop is stolen: support revokes her devices, and its token is refused on every replica.
func support(ctx context.Context, d *demo) error {
	if d.desk == "" {
		d.skip("against -target, the support desk listens on the deployment's ADMIN_ADDR, not the demo's")
		return nil
	}
	d.out.say("A botnet guesses Carla's password from five addresses, filling her document key.")
	for i := range 5 {
		d.show(d.call(ctx, fmt.Sprintf("203.0.113.%d", 100+i), "POST", "/v1/login", "",
			map[string]string{"document": carla.document, "password": fmt.Sprintf("botnet-%d", i)}))
	}
	laptop := d.show(d.call(ctx, "192.0.2.60", "POST", "/v1/login", "", map[string]string{"document": carla.document, "password": carla.password}))
	d.expect("Carla's new laptop is refused: the document key is full", laptop.status == http.StatusTooManyRequests, laptop.summary())

	d.out.say("She calls the bank. Support reads her key on the desk (its own listener, never the public door),\n" +
		"by her CPF, hashed as the limiter hashes it, and clears it on every replica.")
	desk := func(method string) reply {
		r := d.adminCall(ctx, method, "/admin/v1/keys/login-account/"+carla.document)
		d.out.say("  desk       %-6s /admin/v1/keys/login-account/{CPF}  %s", method, r.summary())
		return r
	}
	state := desk(http.MethodGet)
	d.expect("the desk sees the key full", state.status == http.StatusOK && state.body["full"] == true,
		fmt.Sprintf("%s full=%v remaining=%v", state.summary(), state.body["full"], state.body["remaining"]))
	cleared := desk(http.MethodDelete)
	after, _ := cleared.body["after"].(map[string]any)
	d.expect("support clears it", cleared.status == http.StatusOK && after["full"] == false, cleared.summary())
	// The other replica hears of the clearing over Redis's pub/sub, a moment after the desk's
	// answer: a login that reaches it first is refused from its memory of full keys, costing
	// nothing, and she tries again (the replicas alternate).
	var in reply
	tries := 0
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		tries++
		in = d.show(d.call(ctx, "192.0.2.60", "POST", "/v1/login", "", map[string]string{"document": carla.document, "password": carla.password}))
		if in.status != http.StatusTooManyRequests || time.Now().After(deadline) {
			break
		}
	}
	d.expect("Carla gets in at once", in.status == http.StatusOK, fmt.Sprintf("%s after %d tries", in.summary(), tries))

	token, _ := in.body["access_token"].(string)
	account, _ := in.body["account_id"].(string)
	works := d.show(d.call(ctx, "192.0.2.60", "GET", "/v1/statement?limit=1", token, nil))
	d.expect("the laptop's token works before support acts", token != "" && works.status == http.StatusOK, works.summary())
	d.out.say("That laptop is stolen, logged in. Support revokes every trusted device of her account: the tokens\n" +
		"issued until now are refused on every replica, each reading the revocation within half a second.")
	revoked := d.adminCall(ctx, http.MethodDelete, "/admin/v1/accounts/"+account+"/devices")
	d.out.say("  desk       DELETE /admin/v1/accounts/{id}/devices   %s", revoked.summary())
	d.expect("support revokes her devices", revoked.status == http.StatusOK, revoked.summary())
	// Round robin: as many refusals in a row as there are replicas is a refusal by each.
	var last reply
	inARow := 0
	for deadline := time.Now().Add(3 * time.Second); inARow < len(d.replicas) && time.Now().Before(deadline); {
		if last = d.call(ctx, "192.0.2.60", "GET", "/v1/statement", token, nil); last.status == http.StatusUnauthorized {
			inARow++
			continue
		}
		inARow = 0
		time.Sleep(50 * time.Millisecond)
	}
	d.show(last)
	d.expect("the stolen laptop's token is refused on every replica", inARow == len(d.replicas), last.summary())
	return nil
}

// adminCall calls the fleet's support desk with its token, and body when there is one.
func (d *demo) adminCall(ctx context.Context, method, path string, body ...any) reply {
	c := client.Client{BaseURL: d.desk, HTTP: &d.client}
	var b any
	if len(body) > 0 {
		b = body[0]
	}
	resp, err := c.Do(ctx, method, path, b, "Authorization", "Bearer "+d.adminToken, "Admin-Agent", "demo")
	r := reply{method: method, path: path, err: err}
	if err == nil {
		r.status, r.header, r.raw = resp.Status, resp.Header, resp.Body
		_ = json.Unmarshal(resp.Body, &r.body)
	}
	return r
}
