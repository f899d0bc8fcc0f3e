package httpapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/pixlimit/pixlimit/internal/auth"
	"github.com/pixlimit/pixlimit/internal/dict"
	"github.com/pixlimit/pixlimit/internal/enforce"
	"github.com/pixlimit/pixlimit/internal/pix"
	"github.com/pixlimit/pixlimit/internal/ratelimit"
)

// lookupLimiter applies the DICT anti-scan rules (package dict) to the key look-up and the PIX.
// A look-up asks both buckets, in one round trip, before the ledger (a refused look-up costs no
// query), then pays its price, admission and payment in one atomic step per bucket, before it
// answers: look-ups sent together cannot buy more answers than the same look-ups one by one.
type lookupLimiter struct {
	limiter
	rules    dict.Rules
	category string     // the bank's DICT category, as GET /v1/pix/keys/limits reports it
	tiers    *pix.Tiers // nil: every payer at its person's default capacity
}

func newLookupLimiter(l limiter, limits enforce.RouteLimits, tiers *pix.Tiers) lookupLimiter {
	return lookupLimiter{limiter: l, tiers: tiers, category: limits.LookupCategory, rules: dict.Rules{
		Payer: limits.PIXLookup, PayerPJ: limits.PIXLookupPJ, Participant: limits.LookupParticipant,
		MissCost: limits.LookupMissCost, ParticipantMissCost: limits.LookupParticipantMissCost}}
}

// payer is s's payer, at its account's tier's capacity.
func (l lookupLimiter) payer(s auth.Subject) dict.Payer {
	_, _, capacity := tierLimits(l.tiers, s)
	return dict.Payer{ID: s.Payer, Company: s.Person == string(pix.PJ), Capacity: capacity}
}

// bucket is s's payer's bucket for keys of type t.
func (l lookupLimiter) bucket(s auth.Subject, t pix.KeyType) check {
	limit, id := l.rules.PayerBucket(l.payer(s), t)
	return check{limit, id}
}

// bank is the participant's bucket.
func (l lookupLimiter) bank() check {
	limit, id := l.rules.ParticipantBucket()
	return check{limit, id}
}

// sequence is what a ratelimit.Limiter.Decide returned (the decisions of the steps that ran,
// its error) and how long the call took, for limiter.answer to answer each step.
type sequence struct {
	ds   ratelimit.Decisions
	err  error
	took time.Duration
}

// sequenceOf decides steps in one Decide.
func (l lookupLimiter) sequenceOf(ctx context.Context, steps ...ratelimit.Step) sequence {
	start := time.Now()
	ds, err := l.decider().Decide(ctx, steps...)
	return sequence{ds: ds, err: err, took: time.Since(start)}
}

// askAll asks cs in a Decide of one step, for answerAsk: one step takes the batched path of any
// lone decision.
func (l lookupLimiter) askAll(ctx context.Context, cs ...check) (sequence, ratelimit.Step) {
	step := ratelimit.AskStep(checks(cs)...)
	return l.sequenceOf(ctx, step), step
}

// of is step's decision: the decision made, if the step ran (on a cluster, steps can run before
// one fails); else the sequence's error; else, the sequence having stopped at an earlier refusal
// that its route let through (a shadow limit), an ErrUnavailable, so that the step's fail mode
// answers.
func (s sequence) of(step ratelimit.Step) (ratelimit.Decision, error) {
	d, ran := s.ds.Of(step)
	return whatRan(d, ran, s.err, s.ds.Ran())
}

// whatRan is a step's answer (sequence.of): its decision d if it ran, else the sequence's error,
// else (the sequence stopped after `stopped` steps) an ErrUnavailable.
func whatRan(d ratelimit.Decision, ran bool, err error, stopped int) (ratelimit.Decision, error) {
	switch {
	case ran:
		return d, nil
	case err != nil:
		return ratelimit.Decision{}, err
	}
	return ratelimit.Decision{}, fmt.Errorf("%w: a step of a sequence that stopped after %d", ratelimit.ErrUnavailable, stopped)
}

// admitted says whether step ran and was admitted.
func (s sequence) admitted(step ratelimit.Step) bool {
	d, ran := s.ds.Of(step)
	return ran && d.Allowed
}

// refused says whether step ran and was refused.
func (s sequence) refused(step ratelimit.Step) bool {
	d, ran := s.ds.Of(step)
	return ran && !d.Allowed
}

// answerStep is limiter.answer for step of s.
func (l lookupLimiter) answerStep(c echo.Context, rep *report, cs []check, s sequence, step ratelimit.Step) (ratelimit.Decision, error) {
	d, err := s.of(step)
	return l.answer(c, rep, cs, checks(cs), d, err, s.took)
}

// answerAsk answers the ask of the payer's bucket (user) and the bank's (bank), step of asked
// taking nothing: an empty payer's bucket is a 429 reporting it, else an
// empty bank's bucket is a 503 lookup_capacity_exhausted without RateLimit headers; the fail mode
// is the payer bucket's. With quiet, an admission sets no RateLimit headers.
func (l lookupLimiter) answerAsk(c echo.Context, user, bank check, quiet bool, asked sequence, step ratelimit.Step) error {
	bank.limit.FailMode = user.limit.FailMode
	rep := &report{show: func(d ratelimit.Decision) ratelimit.Decision {
		switch {
		case !d.Allowed && d.Results[0].RetryAfter > 0: // the payer's bucket
			return d.Only(0)
		case !d.Allowed: // the bank's bucket alone: not the customer's to see, no RateLimit headers
			return ratelimit.Decision{Worst: d.Results[1]}
		case quiet:
			return ratelimit.Decision{Allowed: true}
		}
		return d.Only(0)
	}, refuse: func(shown ratelimit.Decision) *Error {
		if len(shown.Results) > 0 { // the payer's: a 429
			return nil
		}
		return l.exhausted(bank.limit, shown.Worst.RetryAfter)
	}}
	_, err := l.answerStep(c, rep, []check{user, bank}, asked, step)
	return err
}

// exhausted is the answer while the bank's bucket is empty, logged (at most once per interval).
func (l lookupLimiter) exhausted(bank enforce.RouteLimit, retryAfter time.Duration) *Error {
	l.events.log("exhausted:"+bank.Policy.Name, slog.LevelWarn, "the bank's DICT look-up quota is spent: look-ups answer 503",
		"policy", bank.Policy.Name, "retry_after", retryAfter.String())
	return &Error{Code: CodeLookupCapacityExhausted, RetryAfter: retryAfter}
}

// charge pays a look-up's price once the answer is known, in one limiter call (after first, steps
// never refused that share it, such as a PIX's slot given back): the payer's
// bucket (user) then, unless it refused, the bank's; found costs 1 of each, a miss the payer's
// miss cost and the bank's. A found key's look-up is also granted, in that call, to the payment
// it may lead to (grant is its voucher's identity; "" for a PIX, which is the payment). The payer's
// refusal is 429, reporting its bucket (with quiet, an admission sets no RateLimit headers); the
// bank's is 503 lookup_capacity_exhausted, without them, logged and counted.
func (l lookupLimiter) charge(c echo.Context, user check, found, quiet bool, grant string, first ...ratelimit.Step) error {
	userCost, bankCost := l.rules.Price(found)
	bank := l.bank()
	payUser, payBank := ratelimit.ChargeStep(checks([]check{user})[0], userCost), ratelimit.ChargeStep(checks([]check{bank})[0], bankCost)
	steps := append(first, payUser, payBank)
	var granted ratelimit.Step
	if grant != "" {
		granted = dict.Vouchers.Grant(grant)
		steps = append(steps, granted)
	}
	// On a context the client cannot cancel: a scanner that hangs up once the ledger has answered
	// still pays its miss, and a PIX's slot goes back.
	paid := l.sequenceOf(context.WithoutCancel(c.Request().Context()), steps...)
	quietly := &report{show: func(d ratelimit.Decision) ratelimit.Decision {
		if quiet && d.Allowed {
			return ratelimit.Decision{Allowed: true}
		}
		return d
	}}
	if _, err := l.answerStep(c, quietly, []check{user}, paid, payUser); err != nil {
		return err
	}
	bankReport := &report{show: func(d ratelimit.Decision) ratelimit.Decision { // no RateLimit headers: not the customer's
		return ratelimit.Decision{Allowed: d.Allowed, Worst: d.Worst}
	}, refuse: func(shown ratelimit.Decision) *Error { return l.exhausted(bank.limit, shown.Worst.RetryAfter) }}
	_, payErr := l.answerStep(c, bankReport, []check{bank}, paid, payBank)
	if payErr == nil && granted != nil && !paid.admitted(granted) {
		l.events.log("grant:"+dict.Vouchers.Name, slog.LevelWarn, "a look-up not recorded for the payment that may follow it",
			"policy", dict.Vouchers.Name)
	}
	return payErr
}

// refund gives a look-up's tokens back after the payment it led to (DICT), in one limiter call:
// when s's payer looked key up in the last 10 minutes and that look-up was not given back before
// (its voucher is redeemed), 1 token (2 for a company) to the payer's bucket user and 1 to the
// bank's; after first, steps never refused that share the call (a PIX's slot given back). It is best effort: a refund that cannot reach Redis is logged and lost, which costs the
// customer a token, never the bank a look-up.
func (l lookupLimiter) refund(ctx context.Context, s auth.Subject, user check, key string, first ...ratelimit.Step) {
	payer := l.payer(s)
	toUser, toBank := payer.Refund()
	bank := l.bank()
	steps := []ratelimit.Step{dict.Vouchers.Redeem(dict.Voucher(payer, key)), ratelimit.RefundStep(toUser, checks([]check{user, bank})...)}
	if toUser != toBank {
		steps = []ratelimit.Step{dict.Vouchers.Redeem(dict.Voucher(payer, key)),
			ratelimit.RefundStep(toUser, checks([]check{user})...), ratelimit.RefundStep(toBank, checks([]check{bank})...)}
	}
	if _, err := l.decider().Decide(ctx, append(first, steps...)...); err != nil {
		l.events.log("refund:"+user.limit.Policy.Name, slog.LevelWarn, "look-up tokens not given back after a payment",
			"policy", user.limit.Policy.Name, "cause", err.Error())
	}
}

// handleLookup shows the payer who owns a PIX key before paying: a person's name abbreviated
// as banks show it and the document masked, a company's name and CNPJ in full (both are public
// in the Receita Federal's register), or 404. It is limited by the anti-scan buckets. The key is
// percent-decoded once, then validated: bruno%40example.com is bruno@example.com.
func handleLookup(ledger pix.Payments, share *pix.Share, lookups lookupLimiter) echo.HandlerFunc {
	type response struct {
		Key         string `json:"key"`
		Name        string `json:"name"`
		Document    string `json:"document"`
		Institution string `json:"institution"`
	}
	return func(c echo.Context) error {
		s, err := auth.SubjectOf(c)
		if err != nil {
			return err
		}
		// Echo's c.Param is the escaped segment when the path needed escaping and the decoded one
		// when it did not (bruno%2540 arrives as bruno%40): decode the escaped path, once.
		raw, err := url.PathUnescape(strings.TrimPrefix(c.Request().URL.EscapedPath(), strings.TrimSuffix(c.Path(), ":key")))
		if err != nil {
			return invalid("invalid PIX key", map[string]string{"key": "malformed percent-encoding"})
		}
		key, keyType, err := pix.ParseKey(raw)
		if err != nil {
			return invalid("invalid PIX key", map[string]string{"key": err.Error()})
		}
		user, bank := lookups.bucket(s, keyType), lookups.bank()
		asked, step := lookups.askAll(c.Request().Context(), user, bank)
		if err := lookups.answerAsk(c, user, bank, false, asked, step); err != nil {
			return err
		}
		p, err := lookupKey(c.Request().Context(), ledger, share, s.Account, key)
		switch {
		case errors.Is(err, pix.ErrKeyNotFound):
			if err := lookups.charge(c, user, false, false, ""); err != nil {
				return err
			}
		case err == nil:
			if err := lookups.charge(c, user, true, false, dict.Voucher(lookups.payer(s), key)); err != nil {
				return err
			}
		}
		if err != nil {
			return err
		}
		name, document := abbreviate(p.Name), maskCPF(p.Document)
		if pix.PersonOf(p.Document) == pix.PJ {
			name, document = p.Name, pix.FormatDocument(p.Document)
		}
		return c.JSON(http.StatusOK, response{Key: p.Key, Name: name, Document: document,
			Institution: "pixlimit (ISPB " + pix.ISPB + ")"})
	}
}

// lookupKey looks key up in one of account's places of share (nil: none): the key names no
// account for the ledger to count it against.
func lookupKey(ctx context.Context, ledger pix.Payments, share *pix.Share, account, key string) (pix.Payee, error) {
	if share != nil {
		held, release, err := share.Hold(ctx, account, math.MaxInt64) // the share's own wait bounds it
		if err != nil {
			return pix.Payee{}, err
		}
		defer release()
		ctx = held
	}
	return ledger.LookupKey(ctx, key)
}

// handleLookupLimits shows the payer its own look-up buckets and the bank's DICT category, as
// DICT's GET /policies shows a participant its own: available tokens, capacity, refill. It asks
// each bucket without taking anything, and shows no other customer's state (nor the bank's
// bucket: its level tells how busy the bank is).
func handleLookupLimits(lookups lookupLimiter) echo.HandlerFunc {
	type policy struct {
		Name                string `json:"name"`
		AvailableTokens     int    `json:"available_tokens"`
		Capacity            int    `json:"capacity"`
		RefillTokens        int    `json:"refill_tokens"`
		RefillPeriodSeconds int64  `json:"refill_period_seconds"`
	}
	type response struct {
		Category string   `json:"category"`
		Policies []policy `json:"policies"`
	}
	return func(c echo.Context) error {
		s, err := auth.SubjectOf(c)
		if err != nil {
			return err
		}
		resp := response{Category: lookups.category, Policies: []policy{}}
		for _, t := range []pix.KeyType{pix.KeyEmail, pix.KeyCPF} {
			chk := lookups.bucket(s, t)
			ds, err := lookups.decider().Decide(c.Request().Context(), ratelimit.AskStep(ratelimit.Check{Policy: chk.limit.Policy, Identity: chk.identity}))
			d := ds.Last()
			if err != nil {
				return &Error{Code: CodeRateLimiterUnavailable, RetryAfter: lookups.failClosedRetryAfter, cause: err}
			}
			p := chk.limit.Policy
			resp.Policies = append(resp.Policies, policy{Name: p.Name, AvailableTokens: d.Worst.Remaining, Capacity: p.Burst,
				RefillTokens: p.Limit, RefillPeriodSeconds: int64(p.Window / time.Second)})
		}
		return c.JSON(http.StatusOK, resp)
	}
}

// abbreviate shows a holder's name as banks do: the first name and the last name's initial,
// "Bruno Lima" as "Bruno L.".
func abbreviate(name string) string {
	parts := strings.Fields(name)
	if len(parts) < 2 {
		return name
	}
	last := []rune(parts[len(parts)-1])
	return parts[0] + " " + string(last[0]) + "."
}

// maskCPF shows the middle six digits of a CPF only: "39053344705" as "***.533.447-**".
func maskCPF(cpf string) string {
	if len(cpf) != 11 {
		return "***.***.***-**"
	}
	return "***." + cpf[3:6] + "." + cpf[6:9] + "-**"
}
