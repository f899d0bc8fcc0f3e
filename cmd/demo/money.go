package main

import (
	"context"
	"fmt"
	"net/http"
	"strconv"

	"github.com/pixlimit/pixlimit/internal/pix"
)

// scan: a scanner harvesting PIX keys pays twenty tokens a miss from its account's look-up
// bucket and is stopped after a handful, while a customer who types keys correctly pays one.
func scan(ctx context.Context, d *demo) error {
	const ip = "192.0.2.90"
	diego, err := d.login(ctx, ip, diego.document, diego.password)
	if err != nil {
		return err
	}
	lookup := func(token, key string) reply {
		return d.show(d.call(ctx, ip, "GET", "/v1/pix/keys/"+key, token, nil))
	}
	d.out.say("Before paying, Diego looks up Bruno's phone key and sees who will receive.")
	hit := lookup(diego, "+5511987654321")
	before, _ := strconv.Atoi(hit.header.Get("RateLimit-Remaining"))
	d.expect("a look-up shows the holder abbreviated and the document masked, for one token",
		hit.status == http.StatusOK && hit.str("name") == "Bruno L." && hit.str("document") == "***.533.447-**",
		fmt.Sprintf("%s %s %s, %d tokens left", hit.summary(), hit.str("name"), hit.str("document"), before))

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
	cost := before - after
	d.expect(fmt.Sprintf("each miss costs %d tokens, and the scanner is stopped after %d misses", cost, misses),
		cost > 1 && misses > 0 && misses == (before+cost-1)/cost && probes[misses].status == http.StatusTooManyRequests, sequence(probes))
	return nil
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
