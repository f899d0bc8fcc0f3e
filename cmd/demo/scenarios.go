package main

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pixlimit/pixlimit/internal/pix"
)

// The contract's default limits: what the demo expects a deployment to enforce.
const (
	pixLimit          = 10
	loginIPLimit      = 10
	loginAccountLimit = 5
)

var (
	ana   = struct{ document, password string }{"529.982.247-25", "demo-ana-123"}
	bruno = struct{ document, password string }{"390.533.447-05", "demo-bruno-123"}
	carla = struct{ document, password string }{"111.444.777-35", "demo-carla-123"}
	diego = struct{ document, password string }{"935.411.347-80", "demo-diego-123"}
)

func pixBody(key string, cents int64) map[string]any {
	return map[string]any{"key": key, "amount_cents": cents, "description": "pixlimit demo"}
}

// burst: one office, one IP, three customers. Ana's burst is cut at her account's limit;
// her colleagues are untouched; only admitted transfers move money; Retry-After is honest.
func burst(ctx context.Context, d *demo) error {
	const office = "198.51.100.10"
	d.out.say("Ana, Bruno and Carla work in one office: all their requests leave through one IP, %s.", office)
	anaToken, err := d.login(ctx, office, ana.document, ana.password)
	if err != nil {
		return err
	}
	brunoToken, err := d.login(ctx, office, bruno.document, bruno.password)
	if err != nil {
		return err
	}
	carlaToken, err := d.login(ctx, office, carla.document, carla.password)
	if err != nil {
		return err
	}
	d.carlaLogins++
	before, err := d.balance(ctx, office, anaToken)
	if err != nil {
		return err
	}

	d.out.say("Ana (balance %s) sends 15 PIX of R$ 15,00 to Bruno at once, alternating replicas.", brl(before))
	replies := d.burst(15, func(int) reply {
		return d.call(ctx, office, "POST", "/v1/pix", anaToken, pixBody("bruno@example.com", 1500))
	})
	n, seen := count(replies)
	d.expect(fmt.Sprintf("15 PIX at once: %d × 201, %d × 429", pixLimit, 15-pixLimit),
		n[http.StatusCreated] == pixLimit && n[http.StatusTooManyRequests] == 15-pixLimit, seen)
	wait, honest := 0, n[http.StatusTooManyRequests] > 0
	for _, r := range replies {
		if r.status == http.StatusTooManyRequests {
			s, err := strconv.Atoi(r.header.Get("Retry-After"))
			honest = honest && err == nil && s >= 1 && r.code() == "rate_limit_exceeded"
			wait = max(wait, s)
		}
	}
	d.expect("every 429 says rate_limit_exceeded and carries Retry-After", honest, fmt.Sprintf("Retry-After up to %ds", wait))

	d.out.say("Bruno and Carla, behind the same IP, each send R$ 1,00 to Diego while Ana is blocked.")
	b := d.show(d.call(ctx, office, "POST", "/v1/pix", brunoToken, pixBody("diego@example.com", 100)))
	c := d.show(d.call(ctx, office, "POST", "/v1/pix", carlaToken, pixBody("diego@example.com", 100)))
	d.expect("Bruno and Carla are unaffected: the key is the account, not the IP",
		b.status == http.StatusCreated && c.status == http.StatusCreated, b.summary()+", "+c.summary())

	after, err := d.balance(ctx, office, anaToken)
	if err != nil {
		return err
	}
	moved := before - after
	d.out.say("Ana's balance: %s before, %s after.", brl(before), brl(after))
	d.expect("only the admitted PIX moved money", moved == int64(n[http.StatusCreated])*1500,
		fmt.Sprintf("%s moved for %d × 201", brl(moved), n[http.StatusCreated]))

	if wait == 0 {
		return nil
	}
	if err := d.out.wait(ctx, time.Duration(wait)*time.Second, "(the Retry-After she was given), then Ana sends again"); err != nil {
		return err
	}
	r := d.show(d.call(ctx, office, "POST", "/v1/pix", anaToken, pixBody("bruno@example.com", 1500)))
	d.expect("after Retry-After, Ana's next PIX is admitted", r.status == http.StatusCreated, r.summary())
	return nil
}

// loginAttack: a botnet spreads guesses over many IPs, so only the document key stops it; one
// IP spreads guesses over many documents, so only the IP key stops it; both refusals look the
// same; and the owner of an attacked account is locked out too.
func loginAttack(ctx context.Context, d *demo) error {
	guesses := loginAccountLimit - d.carlaLogins
	d.out.say("A botnet of 20 machines tries passwords for Carla's document, one guess from each IP.")
	if d.carlaLogins > 0 {
		d.out.say("Carla logged in %d time(s) earlier in this window, and every login counts against her document,\n"+
			"successful ones too: the botnet has %d of the %d attempts left.", d.carlaLogins, guesses, loginAccountLimit)
	}
	var bots []reply
	for i := range 20 {
		ip := fmt.Sprintf("203.0.113.%d", i+1)
		bots = append(bots, d.show(d.call(ctx, ip, "POST", "/v1/login", "",
			map[string]string{"document": carla.document, "password": fmt.Sprintf("guess-%d", i+1)})))
	}
	d.expect(fmt.Sprintf("20 IPs, one guess each: %d × 401, then 429 from the document key", guesses),
		inOrder(bots, guesses, http.StatusUnauthorized, http.StatusTooManyRequests), sequence(bots))

	const single = "198.51.100.66"
	d.out.say("One machine, %s, tries 15 different documents, one guess each.", single)
	var sweep []reply
	for i := range 15 {
		doc, _ := pix.CompleteCPF(strconv.Itoa(700000000 + i*7919))
		sweep = append(sweep, d.show(d.call(ctx, single, "POST", "/v1/login", "",
			map[string]string{"document": doc, "password": "123456"})))
	}
	d.expect(fmt.Sprintf("one IP, 15 documents: %d × 401, then 429 from the IP key", loginIPLimit),
		inOrder(sweep, loginIPLimit, http.StatusUnauthorized, http.StatusTooManyRequests), sequence(sweep))

	byDoc, byIP := bots[len(bots)-1], sweep[len(sweep)-1]
	same := byDoc.status == byIP.status && byDoc.code() == byIP.code() && byDoc.str("message") == byIP.str("message") &&
		slices.Equal(slices.Sorted(maps.Keys(byDoc.header)), slices.Sorted(maps.Keys(byIP.header)))
	d.expect("refused by the document key or by the IP key: the same status, body and headers", same,
		fmt.Sprintf("%s vs %s", byDoc.summary(), byIP.summary()))

	d.out.say("During the attack Carla herself logs in, with her password, from a new IP.")
	r := d.show(d.call(ctx, "192.0.2.55", "POST", "/v1/login", "", map[string]string{"document": carla.document, "password": carla.password}))
	d.expect("Carla is refused too: the known cost of a per-account key", r.status == http.StatusTooManyRequests, r.summary())
	d.out.say("That is the trade-off the account key pays: it is what stops a botnet that never reuses an IP,\n" +
		"and it lets that botnet lock the owner out until the window slides past the guesses (Retry-After\n" +
		"tells her when). Banks soften it with a second factor or a trusted-device path; the limit stays.")
	return nil
}

// outage: with Redis gone, login and PIX fail closed, the statement fails open, nothing waits
// past the budget, and limiting resumes by itself.
func outage(ctx context.Context, d *demo) (err error) {
	const ip = "192.0.2.80"
	token, err := d.login(ctx, ip, ana.document, ana.password)
	if err != nil {
		return err
	}
	before, err := d.balance(ctx, ip, token)
	if err != nil {
		return err
	}
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
	p := d.show(d.call(ctx, ip, "POST", "/v1/pix", token, pixBody("bruno@example.com", 1500)))
	d.expect("PIX fails closed: 429 rate_limiter_unavailable",
		p.status == http.StatusTooManyRequests && p.code() == "rate_limiter_unavailable", p.summary())
	s := d.show(d.call(ctx, ip, "GET", "/v1/statement?limit=1", token, nil))
	d.expect("statement fails open: 200 without RateLimit headers",
		s.status == http.StatusOK && s.header.Get("RateLimit-Limit") == "", fmt.Sprintf("%s, RateLimit-Limit %q", s.summary(), s.header.Get("RateLimit-Limit")))
	d.expect("the refused PIX moved no money", s.status == http.StatusOK && s.cents("balance_cents") == before,
		fmt.Sprintf("balance %s, was %s", brl(s.cents("balance_cents")), brl(before)))

	what, err = d.outage.resume(ctx)
	if err != nil {
		return err
	}
	resumed = true
	d.out.say("Redis returns: %s.", what)
	start := time.Now()
	for time.Since(start) < 10*time.Second {
		if r := d.call(ctx, ip, "GET", "/v1/statement?limit=1", token, nil); r.header.Get("RateLimit-Limit") != "" {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	d.out.say("Limiting resumed %v after Redis returned.", time.Since(start).Round(10*time.Millisecond))
	p = d.show(d.call(ctx, ip, "POST", "/v1/pix", token, pixBody("bruno@example.com", 1500)))
	l = d.show(d.call(ctx, ip, "POST", "/v1/login", "", map[string]string{"document": diego.document, "password": diego.password}))
	d.expect("back to normal, no restart: PIX 201 and login 200, with RateLimit headers",
		p.status == http.StatusCreated && l.status == http.StatusOK && p.header.Get("RateLimit-Remaining") != "" && l.header.Get("RateLimit-Remaining") != "",
		p.summary()+", "+l.summary())
	return nil
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

// brl formats cents as Brazilian reais: R$ 10.000,00.
func brl(cents int64) string {
	sign := ""
	if cents < 0 {
		sign, cents = "-", -cents
	}
	whole := strconv.FormatInt(cents/100, 10)
	for i := len(whole) - 3; i > 0; i -= 3 {
		whole = whole[:i] + "." + whole[i:]
	}
	return fmt.Sprintf("%sR$ %s,%02d", sign, whole, cents%100)
}
