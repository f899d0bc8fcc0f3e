package main

import (
	"context"
	"fmt"
	"net/http"
	"strconv"

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
	d.out.say("Then a scanner in Diego's app probes random e-mail keys, as leaked-key harvesters do.")
	var probes []reply
	for i := range 12 {
		r := lookup(diego, fmt.Sprintf("harvest%d@example.com", i))
		probes = append(probes, r)
		if r.status != http.StatusNotFound {
			break
		}
	}
	misses := len(probes) - 1
	after, _ := strconv.Atoi(probes[0].header.Get("RateLimit-Remaining"))
	cost := refilled - after
	d.expect(fmt.Sprintf("each miss costs %d tokens, and the scanner is stopped after %d misses", cost, misses),
		cost > 1 && misses > 0 && misses == (refilled+cost-1)/cost && probes[misses].status == http.StatusTooManyRequests, sequence(probes))
	if inProcess {
		bankAfter, _ := d.bankTokens(ctx)
		d.expect(fmt.Sprintf("the scan cost the bank's own DICT bucket only %d tokens: the scanner's bucket ran dry first", bankBefore-bankAfter),
			bankBefore-bankAfter == 3*misses, fmt.Sprintf("pix-lookup-participant: %d → %d tokens, 3 a miss", bankBefore, bankAfter))
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
		d.out.say("Skipped against -target: the night window is the deployment's, and it may be day there.")
		return nil
	}
	const ip = "192.0.2.95"
	bruno, err := d.login(ctx, ip, bruno.document, bruno.password)
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
	d.expect("the transfer that crosses R$ 1.000,00 tonight is refused, and says how much is left",
		first.status == http.StatusCreated && second.status == http.StatusUnprocessableEntity && second.code() == "night_limit_exceeded",
		second.summary()+": "+second.str("message"))
	d.expect("only the first moved money", before-after == 90_000, fmt.Sprintf("%s moved", pix.BRL(before-after)))
	return nil
}
