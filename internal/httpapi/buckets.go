package httpapi

import (
	"context"
	"log/slog"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/pixlimit/pixlimit/internal/auth"
	"github.com/pixlimit/pixlimit/internal/dict"
	"github.com/pixlimit/pixlimit/internal/enforce"
	"github.com/pixlimit/pixlimit/internal/pix"
	"github.com/pixlimit/pixlimit/internal/ratelimit"
)

// buckets are the DICT anti-scan buckets (package dict) a key look-up and a PIX pay: the payer's,
// per key type, and the bank's. A look-up (lookup.go) asks both, in one round trip, before the
// ledger (a refused look-up costs no query), then pays its price, admission and payment in one
// atomic step per bucket, before it answers: look-ups sent together cannot buy more answers than
// the same look-ups one by one. A PIX (admission.go) asks them and takes a miss's price in its
// admission, and settles them after the ledger: a miss keeps it paid, any other answer gives it
// back, and a payment refunds its look-up.
type buckets struct {
	limiter
	rules    dict.Rules
	category string     // the bank's DICT category, as GET /v1/pix/keys/limits reports it
	tiers    *pix.Tiers // nil: every payer at its person's default capacity
}

func newBuckets(l limiter, limits enforce.RouteLimits, tiers *pix.Tiers) buckets {
	return buckets{limiter: l, tiers: tiers, category: limits.LookupCategory, rules: dict.Rules{
		Payer: limits.PIXLookup, PayerPJ: limits.PIXLookupPJ, Participant: limits.LookupParticipant,
		MissCost: limits.LookupMissCost, ParticipantMissCost: limits.LookupParticipantMissCost}}
}

// payer is s's payer, at its account's tier's capacity.
func (b buckets) payer(s auth.Subject) dict.Payer {
	return dict.Payer{ID: s.Payer, Company: s.Person == string(pix.PJ), Capacity: figures(b.tiers, s).LookupCapacity}
}

// bucket is s's payer's bucket for keys of type t.
func (b buckets) bucket(s auth.Subject, t pix.KeyType) check {
	limit, id := b.rules.PayerBucket(b.payer(s), t)
	return checkOf(limit, id)
}

// bank is the participant's bucket.
func (b buckets) bank() check {
	limit, id := b.rules.ParticipantBucket()
	return checkOf(limit, id)
}

// askAll asks cs in a Decide of one step, for answerAsk: one step takes the batched path of any
// lone decision.
func (b buckets) askAll(ctx context.Context, cs ...check) (sequence, ratelimit.Step) {
	step := ratelimit.AskStep(checks(cs)...)
	return b.sequenceOf(ctx, step), step
}

// answerAsk answers the ask of the payer's bucket (user) and the bank's (bank), step of asked
// taking nothing: an empty payer's bucket is a 429 reporting it, else an
// empty bank's bucket is a 503 lookup_capacity_exhausted without RateLimit headers; the fail mode
// is the payer bucket's. With quiet, an admission sets no RateLimit headers.
func (b buckets) answerAsk(c echo.Context, user, bank check, quiet bool, asked sequence, step ratelimit.Step) error {
	bank.failMode = user.failMode
	rep := &report{show: func(d ratelimit.Decision) ratelimit.Decision {
		switch {
		case !d.Allowed && d.Results[0].RetryAfter > 0: // the payer's bucket
			return first(d)
		case !d.Allowed: // the bank's bucket alone: not the customer's to see, no RateLimit headers
			return ratelimit.Decision{Worst: d.Results[1]}
		case quiet:
			return ratelimit.Decision{Allowed: true}
		}
		return first(d)
	}, refuse: func(shown ratelimit.Decision) *Error {
		if len(shown.Results) > 0 { // the payer's: a 429
			return nil
		}
		return b.exhausted(bank.Policy, shown.Worst.RetryAfter)
	}}
	_, err := b.answerStep(c, rep, []check{user, bank}, asked, step)
	return err
}

// exhausted is the answer while the bank's bucket is empty, logged (at most once per interval).
func (b buckets) exhausted(bank ratelimit.Policy, retryAfter time.Duration) *Error {
	b.events.log("exhausted:"+bank.Name, slog.LevelWarn, "the bank's DICT look-up quota is spent: look-ups answer 503",
		"policy", bank.Name, "retry_after", retryAfter.String())
	return &Error{Code: CodeLookupCapacityExhausted, RetryAfter: retryAfter}
}

// charge pays a look-up's price once the answer is known, in one limiter call: the payer's
// bucket (user) then, unless it refused, the bank's; found costs 1 of each, a miss the payer's
// miss cost and the bank's. A found key's look-up is also granted, in that call, to the payment
// it may lead to (grant is its voucher's identity; "" for none). The payer's refusal is 429,
// reporting its bucket; the bank's is 503 lookup_capacity_exhausted, without RateLimit headers,
// logged and counted, and the payer's charge, made before it in the call, is given back
// (refundUser): the customer did nothing wrong. (A PIX takes its price in its admission:
// admission.go.)
func (b buckets) charge(c echo.Context, user check, found bool, grant string) error {
	userCost, bankCost := b.rules.Price(found)
	bank := b.bank()
	payUser, payBank := ratelimit.ChargeStep(user.Check, userCost), ratelimit.ChargeStep(bank.Check, bankCost)
	steps := []ratelimit.Step{payUser, payBank}
	var granted ratelimit.Step
	if grant != "" {
		granted = dict.Vouchers.Grant(grant)
		steps = append(steps, granted)
	}
	// On a context the client cannot cancel: a scanner that hangs up once the ledger has answered
	// still pays its miss.
	paid := b.sequenceOf(context.WithoutCancel(c.Request().Context()), steps...)
	if paid.refused(payBank) {
		b.refundUser(context.WithoutCancel(c.Request().Context()), user, userCost)
	}
	payErr := b.answerPaid(c, user, bank, false, true, paid, payUser, payBank)
	if payErr == nil && granted != nil && !paid.admitted(granted) {
		b.events.log("grant:"+dict.Vouchers.Name, slog.LevelWarn, "a look-up not recorded for the payment that may follow it",
			"policy", dict.Vouchers.Name)
	}
	return payErr
}

// answerPaid answers the charges of a price to the payer's bucket (user, step payUser) and the
// bank's (payBank), in paid: the payer's refusal is 429, reporting its bucket (with quiet, an
// admission sets no RateLimit headers); the bank's is 503 lookup_capacity_exhausted, without
// them, logged and counted. A payer's charge the bank's then refused is not answered (its tokens
// go back: refundUser, or the PIX's giveBack). paying says the decision was counted already, by
// the ask before it (a look-up's).
func (b buckets) answerPaid(c echo.Context, user, bank check, quiet, paying bool, paid sequence, payUser, payBank ratelimit.Step) error {
	quietly := &report{paying: paying, show: func(d ratelimit.Decision) ratelimit.Decision {
		if quiet && d.Allowed {
			return ratelimit.Decision{Allowed: true}
		}
		return d
	}}
	if !paid.refused(payBank) {
		if _, err := b.answerStep(c, quietly, []check{user}, paid, payUser); err != nil {
			return err
		}
	}
	bankReport := &report{paying: paying, show: func(d ratelimit.Decision) ratelimit.Decision { // no RateLimit headers: not the customer's
		return ratelimit.Decision{Allowed: d.Allowed, Worst: d.Worst}
	}, refuse: func(shown ratelimit.Decision) *Error { return b.exhausted(bank.Policy, shown.Worst.RetryAfter) }}
	_, err := b.answerStep(c, bankReport, []check{bank}, paid, payBank)
	return err
}

// answerPrice answers a PIX's admission's charge of a miss's price (answerPaid, quiet), when
// it is the buckets' decision, taken with no ask before it (a cluster's, a shadow limit's).
func (b buckets) answerPrice(c echo.Context, user, bank check, decided sequence, payUser, payBank ratelimit.Step) error {
	bank.failMode = user.failMode
	return b.answerPaid(c, user, bank, true, false, decided, payUser, payBank)
}

// refundUser gives the payer's bucket user back the cost it paid for an answer the bank's bucket
// then refused, in a call of its own (one more, on that path alone); best effort, as refund.
func (b buckets) refundUser(ctx context.Context, user check, cost int) {
	if _, err := b.decider().Decide(ctx, ratelimit.RefundStep(cost, user.Check)); err != nil {
		b.events.log("refund:"+user.Policy.Name, slog.LevelWarn, "a look-up's charge not given back after the bank's bucket refused it",
			"policy", user.Policy.Name, "cause", err.Error())
	}
}

// refund gives a look-up's tokens back after the payment it led to (DICT), in one limiter call:
// when s's payer looked key up in the last 10 minutes and that look-up was not given back before
// (its voucher is redeemed), 1 token (2 for a company) to the payer's bucket user and 1 to the
// bank's; after first, steps never refused that share the call (a PIX's slot given back, tried
// again if Redis does not answer: releaseLater), and give (a PIX's price given back, never
// refused). It is best effort: a refund that cannot reach Redis is logged and lost, which costs
// the customer tokens, never the bank a look-up.
func (b buckets) refund(ctx context.Context, s auth.Subject, user check, key string, first []ratelimit.Step, give ...ratelimit.Step) {
	payer := b.payer(s)
	toUser, toBank := payer.Refund()
	bank := b.bank()
	steps := []ratelimit.Step{dict.Vouchers.Redeem(dict.Voucher(payer, key)), ratelimit.RefundStep(toUser, user.Check, bank.Check)}
	if toUser != toBank {
		steps = []ratelimit.Step{dict.Vouchers.Redeem(dict.Voucher(payer, key)),
			ratelimit.RefundStep(toUser, user.Check), ratelimit.RefundStep(toBank, bank.Check)}
	}
	if _, err := b.decider().Decide(ctx, append(append(first, give...), steps...)...); err != nil {
		b.events.log("refund:"+user.Policy.Name, slog.LevelWarn, "look-up tokens not given back after a payment",
			"policy", user.Policy.Name, "cause", err.Error())
		if len(first) > 0 {
			b.releaseLater(first, err)
		}
	}
}
