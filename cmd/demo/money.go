package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/pixlimit/pixlimit/internal/pix"
)

// scan: the DICT anti-scan policy. A look-up followed by its payment costs nothing (the payment
// gives the token back); a scanner harvesting keys pays twenty tokens a miss from its own bucket
// and is stopped after a handful, having cost the bank's own bucket only three a miss.
func scan(ctx context.Context, d *demo) error {
	const ip = "192.0.2.90"
	diego, err := d.login(ctx, ip, diego.document, diego.password)
	if err != nil {
		return err
	}
	lookup := func(token, key string) reply {
		return d.show(d.call(ctx, ip, "GET", "/v1/pix/keys/"+key, token, nil))
	}
	buckets := func(token string) reply { return d.show(d.call(ctx, ip, "GET", "/v1/pix/keys/limits", token, nil)) }
	d.out.say("Before paying, Diego looks up Bruno's phone key and sees who will receive.")
	hit := lookup(diego, "+5511987654321")
	before, _ := strconv.Atoi(hit.header.Get("RateLimit-Remaining"))
	d.expect("a look-up shows the holder abbreviated and the document masked, for one token",
		hit.status == http.StatusOK && hit.str("name") == "Bruno L." && hit.str("document") == "***.533.447-**",
		fmt.Sprintf("%s %s %s, %d tokens left", hit.summary(), hit.str("name"), hit.str("document"), before))
	d.out.say("He pays: as at DICT, the payment gives the look-up's token back.")
	paid := d.show(d.pix(ctx, ip, diego, pixBody("+5511987654321", 100)))
	refilled := available(buckets(diego), "pix-lookup")
	d.expect("a look-up followed by its payment costs nothing", paid.status == http.StatusCreated && refilled == before+1,
		fmt.Sprintf("%s, then %d tokens in pix-lookup", paid.summary(), refilled))

	bankBefore, inProcess := d.bankTokens(ctx)
	scanStart := time.Now()
	d.out.say("Then a scanner in Diego's app probes random e-mail keys, as leaked-key harvesters do.")
	var probes []reply
	for i := range min(refilled+2, 200) { // enough to spend any bucket of Diego's, a token a miss or more
		r := lookup(diego, fmt.Sprintf("harvest%d@example.com", i))
		probes = append(probes, r)
		if r.status != http.StatusNotFound {
			break
		}
	}
	misses := len(probes) - 1
	after, _ := strconv.Atoi(probes[0].header.Get("RateLimit-Remaining"))
	cost := refilled - after
	want := (refilled + max(cost, 1) - 1) / max(cost, 1) // the misses the bucket pays for
	d.expect(fmt.Sprintf("each miss costs %d tokens, and the scanner is stopped after %d misses", cost, want),
		cost > 1 && misses > 0 && misses == want && probes[misses].status == http.StatusTooManyRequests, sequence(probes))
	if inProcess {
		bankAfter, _ := d.bankTokens(ctx)
		// The bank's bucket refills as the scan goes on: as much as the scan's time lets it, at
		// most (a slow machine's scan takes longer).
		refill := int(time.Since(scanStart)*time.Duration(d.bank.Limit)/d.bank.Window) + 1
		spent := bankBefore - bankAfter
		d.expect(fmt.Sprintf("the scan cost the bank's own DICT bucket only %d tokens: the scanner's bucket ran dry first", spent),
			spent <= 3*misses && spent >= 3*misses-refill,
			fmt.Sprintf("pix-lookup-participant: %d → %d tokens, 3 a miss less up to %d refilled", bankBefore, bankAfter, refill))
	}
	return nil
}

// available is a policy's available tokens in a GET /v1/pix/keys/limits reply, or -1.
func available(r reply, policy string) int {
	policies, _ := r.body["policies"].([]any)
	for _, p := range policies {
		if m, _ := p.(map[string]any); m["name"] == policy {
			n, _ := m["available_tokens"].(float64)
			return int(n)
		}
	}
	return -1
}

// night: the night-time value cap is the ledger's, enforced in the transfer's transaction.
func night(ctx context.Context, d *demo) error {
	if d.limiters == nil {
		d.skip("against -target, the night window is the deployment's, and it may be day there")
		return nil
	}
	const ip = "192.0.2.95"
	bruno, err := d.trustedLogin(ctx, ip, bruno)
	if err != nil {
		return err
	}
	d.out.say("It is night in São Paulo (the demo sets the window around now): transfers may not sum past\n" +
		"R$ 1.000,00 tonight. Bruno sends R$ 900,00, then R$ 200,00.")
	before, err := d.balance(ctx, ip, bruno)
	if err != nil {
		return err
	}
	first := d.show(d.pix(ctx, ip, bruno, pixBody("ana@example.com", 90_000)))
	second := d.show(d.pix(ctx, ip, bruno, pixBody("ana@example.com", 20_000)))
	after, err := d.balance(ctx, ip, bruno)
	if err != nil {
		return err
	}
	left, said := second.body["remaining_cents"].(float64) // what the night leaves: some, at most what the first left
	d.expect("the transfer that crosses R$ 1.000,00 tonight is refused, and says how much is left",
		first.status == http.StatusCreated && second.status == http.StatusUnprocessableEntity && second.code() == "night_limit_exceeded" &&
			said && left > 0 && left <= 100_000-90_000,
		second.summary()+": "+second.str("message"))
	d.expect("only the first moved money", before-after == 90_000, fmt.Sprintf("%s moved", pix.BRL(before-after)))
	return nil
}

// trustedLogin logs who in from ip on their own phone, registered for PIX: the login (with the
// phone's device token, once it has one), then the registration with the password again (the
// bank's strong authentication stands behind it in a real app). The first device of an account
// registers at once; the same phone again finds itself registered.
func (d *demo) trustedLogin(ctx context.Context, ip string, who account) (string, error) {
	var headers []string
	if phone := d.phones[who.document]; phone != "" {
		headers = []string{"Device-Token", phone}
	}
	r := d.show(d.call(ctx, ip, "POST", "/v1/login", "", map[string]string{"document": who.document, "password": who.password}, headers...))
	if r.status != http.StatusOK {
		return "", fmt.Errorf("login %s from %s: %s", who.document, ip, r.summary())
	}
	token := r.str("access_token")
	if d.phones == nil {
		d.phones = map[string]string{}
	}
	d.phones[who.document] = r.str("device_token")
	reg := d.show(d.call(ctx, ip, "POST", "/v1/devices/current/register", token, map[string]string{"password": who.password}))
	if reg.status == http.StatusAccepted && d.desk != "" {
		// The account has had a registered device (an earlier story's): only the account's first
		// device ever registers at once. The bank's support desk, having checked who calls,
		// approves this one.
		account, device := r.str("account_id"), reg.str("device_id")
		reg = d.adminCall(ctx, http.MethodPost, "/admin/v1/accounts/"+account+"/devices/"+device+"/approve")
		d.out.say("  desk       POST   /admin/v1/accounts/{id}/devices/{device}/approve  %s", reg.summary())
	}
	switch {
	case reg.status == http.StatusAccepted:
		return "", fmt.Errorf("%w: %s's account has had a registered phone (an earlier run against this deployment), so "+
			"a new one waits DEVICE_REGISTRATION_DELAY unless a registered device or the support desk approves it "+
			"(POST /admin/v1/accounts/{id}/devices/{device}/approve)", errPhoneWaits, who.document)
	case reg.status != http.StatusOK || reg.body["registered"] != true:
		return "", fmt.Errorf("registering %s's phone: %s", who.document, reg.summary())
	}
	return token, nil
}

// errPhoneWaits: the story's own phone waits to register, and no desk is at hand to approve it.
var errPhoneWaits = errors.New("the phone waits to register")

// asConfigured says whether got is the demo's own fleet's figure, want, or, against a target
// whose configuration the demo cannot read, any figure below above (a cap or a limit that still
// refuses what the story sends).
func (d *demo) asConfigured(got, want, above int64) bool {
	if d.target {
		return got < above
	}
	return got == want
}

// later says whether t is 24 hours away (the demo's fleet's delays), or, against a target, in the
// future at all (LIMIT_INCREASE_DELAY, DEVICE_REGISTRATION_DELAY are the deployment's).
func (d *demo) later(t time.Time) bool {
	if d.target {
		return time.Until(t) > 0
	}
	return time.Until(t) > 23*time.Hour
}

// evening: a stolen evening. Bruno's own phone is registered for PIX. A phone that never paid
// with his account logs in to it with his phished password: its R$ 500,00 PIX is refused (a new
// device may send R$ 200,00 at most), its request to raise the night limit is recorded for
// tomorrow, not applied, and its registration for PIX, password and all, waits a day, since the
// account has a registered phone. Bruno, on his phone, cancels the raise, sees the phisher's
// phone pending and removes it (its token is refused from then on), and pays a bakery
// R$ 1.200,00 at night: not capped as a new device, and outside the night cap, which is between
// persons. Bruno's document key counts the phisher's login, the burst story's and the night
// story's (his phone's later login counts against its own device key): three of the five it
// allows in a deployment's ten minutes.
func evening(ctx context.Context, d *demo) error {
	const own, thief = "192.0.2.100", "203.0.113.66"
	mine, err := d.trustedLogin(ctx, own, bruno)
	if errors.Is(err, errPhoneWaits) {
		d.skip("%s", err)
		return nil
	}
	if err != nil {
		return err
	}
	d.out.say("A phone that never paid from Bruno's account logs in with his password (phished) and sends R$ 500,00.")
	stolen, err := d.login(ctx, thief, bruno.document, bruno.password)
	if err != nil {
		return err
	}
	// To Carla's CPF key: its look-up bucket is not the one the scan story emptied.
	refused := d.show(d.pix(ctx, thief, stolen, pixBody("11144477735", 50_000)))
	d.expect("a device never registered for PIX cannot send R$ 500,00, and is told how much it may and how to register",
		refused.status == http.StatusUnprocessableEntity && refused.code() == "device_limit_exceeded" && d.asConfigured(refused.cents("remaining_cents"), 20_000, 50_000),
		refused.summary()+": "+refused.str("message"))

	d.out.say("It asks to raise the night limit to R$ 10.000,00, to empty the account tonight.")
	raise := d.show(d.call(ctx, thief, "PUT", "/v1/limits", stolen, map[string]any{"night_limit_cents": 1_000_000}))
	pending, _ := raise.body["pending"].([]any)
	var effective time.Time
	if len(pending) == 1 {
		p, _ := pending[0].(map[string]any)
		effective, _ = time.Parse(time.RFC3339Nano, fmt.Sprint(p["effective_at"]))
	}
	d.expect("a higher limit is only recorded, for later (24 hours unless the deployment says otherwise): tonight's stays",
		raise.status == http.StatusOK && d.asConfigured(raise.cents("night_limit_cents"), 100_000, 1_000_000) && d.later(effective),
		fmt.Sprintf("%s, night limit %s, R$ 10.000,00 pending until %s", raise.summary(), pix.BRL(raise.cents("night_limit_cents")),
			effective.Format(time.RFC3339)))

	d.out.say("It registers itself for PIX with the phished password: Bruno's account has had a registered phone,\n" +
		"so it waits a day (only an account's first device ever registers at once; after a revocation too).")
	reg := d.show(d.call(ctx, thief, "POST", "/v1/devices/current/register", stolen, map[string]string{"password": bruno.password}))
	until, _ := time.Parse(time.RFC3339Nano, reg.str("pending_until"))
	phisher := reg.str("device_id")
	d.expect("a phished password does not register a new phone once the account has had one: it waits (24 hours unless the deployment says otherwise)",
		reg.status == http.StatusAccepted && reg.body["registered"] == false && d.later(until),
		fmt.Sprintf("%s, pending until %s", reg.summary(), until.Format(time.RFC3339)))

	d.out.say("Bruno, on his own registered phone, sees both requests: he cancels the raise, and removes the phone\n" +
		"he does not know, whose token is refused from then on.")
	cancelled := d.show(d.call(ctx, own, "DELETE", "/v1/limits/pending", mine, nil))
	left, _ := cancelled.body["pending"].([]any)
	d.expect("Bruno cancels the raise from his phone: nothing pending", cancelled.status == http.StatusOK && len(left) == 0,
		fmt.Sprintf("%s, %d pending", cancelled.summary(), len(left)))
	seen := d.listsPending(ctx, own, mine, phisher)
	removed := d.show(d.call(ctx, own, "DELETE", "/v1/devices/"+phisher, mine, nil))
	var after reply
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(50 * time.Millisecond) { // every replica within its poll
		if after = d.call(ctx, thief, "GET", "/v1/statement?limit=1", stolen, nil); after.status == http.StatusUnauthorized || time.Now().After(deadline) {
			break
		}
	}
	d.show(after)
	d.expect("the owner sees the pending phone and removes it: its token is refused",
		seen && removed.status == http.StatusNoContent && after.status == http.StatusUnauthorized,
		fmt.Sprintf("listed %t, %s, then %s", seen, removed.summary(), after.summary()))
	d.out.say("He pays the Padaria Pão Quente R$ 1.200,00: a registered device is not capped as a new one, and a\n" +
		"company is outside the night cap.")
	bakery := d.show(d.pix(ctx, own, mine, pixBody("padaria@example.com", 120_000)))
	d.expect("the customer's registered device is not capped as a new one", bakery.status == http.StatusCreated, bakery.summary())
	if d.limiters != nil { // in-process the night is set around now; a deployment's may be day
		d.out.say("The same R$ 1.200,00 to Ana, a person, is past his night limit (R$ 1.000,00).")
		person := d.show(d.pix(ctx, own, mine, pixBody("ana@example.com", 120_000)))
		d.expect("the night cap covers payments between persons only: to Ana refused at night, to a company passed",
			bakery.status == http.StatusCreated && person.status == http.StatusUnprocessableEntity && person.code() == "night_limit_exceeded",
			bakery.summary()+"; "+person.summary())
	}
	return nil
}

// listsPending says whether the account of token, from ip, lists device as pending (not registered).
func (d *demo) listsPending(ctx context.Context, ip, token, device string) bool {
	listed := d.show(d.call(ctx, ip, "GET", "/v1/devices", token, nil))
	devices, _ := listed.body["devices"].([]any)
	for _, x := range devices {
		if m, _ := x.(map[string]any); m["device_id"] == device && m["registered"] == false {
			return true
		}
	}
	return false
}
