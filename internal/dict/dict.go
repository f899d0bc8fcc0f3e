// Package dict holds the central bank's DICT anti-scan rules as a participant mirrors them
// (DICT API specification v1.8.0, "Limitação de requisições"; Manual Operacional do DICT,
// §13.1), so that no customer can spend the bank's quota at DICT and the bank never meets a 429
// from DICT. It says which buckets a key look-up or a PIX touches, what each costs and what a
// payment gives back; it decides nothing itself (a ratelimit.Limiter does) and knows no HTTP.
//
//   - Two buckets per payer, keyed by the payer's document (DICT's PI-PayerId, the CPF or CNPJ,
//     not the account: a customer with several accounts has one budget): pix-lookup for e-mail
//     and phone keys (ENTRIES_READ_USER_ANTISCAN) and pix-lookup-v2 for CPF, CNPJ and random keys
//     (ENTRIES_READ_USER_ANTISCAN_V2). Capacity 100 for a person, 1,000 for a company, refill 2
//     a minute (20 for a company); a found key costs 1, a key nobody has 20.
//   - One bucket for the whole bank, pix-lookup-participant (ENTRIES_READ_PARTICIPANT_ANTISCAN),
//     sized by the bank's DICT category (Category): a found key costs 1, a miss 3.
//   - A look-up that led to a payment gives its tokens back, as DICT does: a PIX answered 201 to
//     a key that the same payer looked up, answered 200, in the previous 10 minutes, and not given
//     back before (its Voucher), gives 1 token (2 for a company payer) back to the payer's bucket
//     of that key's type and 1 to the bank's, never above capacity. A PIX with no look-up before
//     it gives nothing back: a customer who looks up and pays loses nothing, a scanner who never
//     pays drains, and paying cents to a key is no way to refill.
//
// The payer's bucket is asked and paid first, so a scanner drains its own bucket, not the
// bank's: five misses empty a person's bucket and cost the bank's 15 tokens.
package dict

import (
	"time"

	"github.com/pixlimit/pixlimit/internal/enforce"
	"github.com/pixlimit/pixlimit/internal/pix"
	"github.com/pixlimit/pixlimit/internal/ratelimit/grants"
)

// Rules are the bank's DICT buckets, as configured.
type Rules struct {
	// Payer is the payer's bucket (pix-lookup) at a person's capacity, PayerPJ at a company's;
	// the bucket of CPF, CNPJ and random keys is the same policy named pix-lookup-v2.
	Payer, PayerPJ enforce.RouteLimit
	// Participant is the bank's own bucket (pix-lookup-participant), shared by every customer
	// and replica.
	Participant enforce.RouteLimit
	// MissCost and ParticipantMissCost are what a key nobody has costs each bucket.
	MissCost, ParticipantMissCost int
}

// Payer is who looks keys up and pays.
type Payer struct {
	// ID names the payer's document, opaque (auth.Tokens.PayerID): its buckets' identity.
	ID string
	// Company is a CNPJ's payer.
	Company bool
	// Capacity is the payer's buckets' capacity by its account's tier; 0 is the default.
	Capacity int
}

// PayerBucket is p's bucket for keys of type t, and its identity: pix-lookup, or pix-lookup-v2,
// at p's capacity. A tier's capacity keeps the bucket's key, and what it holds.
func (r Rules) PayerBucket(p Payer, t pix.KeyType) (enforce.RouteLimit, string) {
	limit := r.Payer
	if p.Company {
		limit = r.PayerPJ
	}
	if p.Capacity > 0 {
		limit.Policy.Burst = p.Capacity
	}
	if t.V2() {
		limit.Policy.Name += "-v2"
	}
	return limit, p.ID
}

// ParticipantIdentity is the identity of the bank's own bucket: one for every customer and
// replica.
const ParticipantIdentity = "ispb:" + pix.ISPB

// ParticipantBucket is the bank's bucket and its identity.
func (r Rules) ParticipantBucket() (enforce.RouteLimit, string) {
	return r.Participant, ParticipantIdentity
}

// Price is what a look-up costs the payer's bucket and the bank's, once its answer is known:
// found, 1 each; a key nobody has, MissCost and ParticipantMissCost.
func (r Rules) Price(found bool) (payer, participant int) {
	if found {
		return 1, 1
	}
	return r.MissCost, r.ParticipantMissCost
}

// Refund is what a payment that a look-up led to gives back: 1 token to the payer's bucket (2
// to a company's) and 1 to the bank's.
func (p Payer) Refund() (payer, participant int) {
	if p.Company {
		return 2, 1
	}
	return 1, 1
}

// Vouchers keep each look-up answered 200, per payer and key, for the payment that may follow
// it within 10 minutes to give its tokens back once (package grants); a key holds at most 100
// such look-ups.
var Vouchers = grants.Vouchers{Name: "pix-lookup-voucher", Max: 100, Lifetime: 10 * time.Minute}

// Voucher is the identity of p's look-ups of key that a payment may redeem (in Vouchers).
func Voucher(p Payer, key string) string { return p.ID + "|" + key }

// Category is DICT's table of the participant's bucket (ENTRIES_READ_PARTICIPANT_ANTISCAN;
// Manual Operacional do DICT, §13.1, 2025) for a category, A to H: its refill per minute and
// capacity. The central bank assigns the category by the participant's number of accounts;
// pixlimit's default, D, is a mid-sized bank's.
func Category(name string) (refill, capacity int, ok bool) {
	c, ok := categories[name]
	return c.refill, c.capacity, ok
}

var categories = map[string]struct{ refill, capacity int }{
	"A": {25_000, 50_000}, "B": {20_000, 40_000}, "C": {15_000, 30_000}, "D": {8_000, 16_000},
	"E": {2_500, 5_000}, "F": {250, 500}, "G": {25, 250}, "H": {2, 50},
}

// DefaultParticipantMissCost is what a key nobody has costs the bank's bucket in DICT's table.
const DefaultParticipantMissCost = 3
