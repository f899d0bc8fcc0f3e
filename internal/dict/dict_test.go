package dict_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pixlimit/pixlimit/internal/dict"
	"github.com/pixlimit/pixlimit/internal/enforce"
	"github.com/pixlimit/pixlimit/internal/pix"
	"github.com/pixlimit/pixlimit/internal/ratelimit"
	"github.com/pixlimit/pixlimit/internal/ratelimit/sequence"
	"github.com/pixlimit/pixlimit/internal/testing/redistest"
)

// rules are DICT's table for a person, a company and a category D bank.
var rules = dict.Rules{
	Payer: enforce.RouteLimit{Policy: ratelimit.Policy{Name: "pix-lookup", Limit: 2, Window: time.Minute,
		Algorithm: ratelimit.TokenBucket, Burst: 100}},
	PayerPJ: enforce.RouteLimit{Policy: ratelimit.Policy{Name: "pix-lookup", Limit: 20, Window: time.Minute,
		Algorithm: ratelimit.TokenBucket, Burst: 1000}},
	Participant: enforce.RouteLimit{Policy: ratelimit.Policy{Name: "pix-lookup-participant", Limit: 8000, Window: time.Minute,
		Algorithm: ratelimit.TokenBucket, Burst: 16000}},
	MissCost: 20, ParticipantMissCost: dict.DefaultParticipantMissCost,
}

func TestBucketsPricesAndRefunds(t *testing.T) {
	t.Parallel()
	person, company := dict.Payer{ID: "p1"}, dict.Payer{ID: "c1", Company: true}
	tiered := dict.Payer{ID: "p2", Capacity: 300}
	for _, tt := range []struct {
		payer    dict.Payer
		key      pix.KeyType
		name     string
		capacity int
	}{
		{person, pix.KeyEmail, "pix-lookup", 100},
		{person, pix.KeyPhone, "pix-lookup", 100},
		{person, pix.KeyCPF, "pix-lookup-v2", 100},
		{person, pix.KeyRandom, "pix-lookup-v2", 100},
		{company, pix.KeyEmail, "pix-lookup", 1000},
		{company, pix.KeyCNPJ, "pix-lookup-v2", 1000},
		{tiered, pix.KeyEmail, "pix-lookup", 300},
	} {
		limit, id := rules.PayerBucket(tt.payer, tt.key)
		if limit.Policy.Name != tt.name || limit.Policy.Capacity() != tt.capacity || id != tt.payer.ID {
			t.Errorf("%+v, %s key: %s at %d for %q, want %s at %d for %q", tt.payer, tt.key, limit.Policy.Name,
				limit.Policy.Capacity(), id, tt.name, tt.capacity, tt.payer.ID)
		}
	}
	if p, b := rules.Price(true); p != 1 || b != 1 {
		t.Errorf("a found key costs %d and %d, want 1 and 1", p, b)
	}
	if p, b := rules.Price(false); p != 20 || b != 3 {
		t.Errorf("a miss costs %d and %d, want 20 and 3", p, b)
	}
	if p, b := person.Refund(); p != 1 || b != 1 {
		t.Errorf("a person's payment gives back %d and %d, want 1 and 1", p, b)
	}
	if p, b := company.Refund(); p != 2 || b != 1 {
		t.Errorf("a company's payment gives back %d and %d, want 2 and 1", p, b)
	}
	if _, id := rules.ParticipantBucket(); id != "ispb:"+pix.ISPB {
		t.Errorf("the bank's bucket is %q, want one for the bank", id)
	}
	if a, b := dict.Voucher(person, "bruno@example.com"), dict.Voucher(company, "bruno@example.com"); a == b {
		t.Error("two payers' look-ups of one key share a voucher")
	}
	// DICT's table, every category (a typo in one a test did not name passed before).
	for name, want := range map[string][2]int{"A": {25_000, 50_000}, "B": {20_000, 40_000}, "C": {15_000, 30_000},
		"D": {8_000, 16_000}, "E": {2_500, 5_000}, "F": {250, 500}, "G": {25, 250}, "H": {2, 50}} {
		if refill, capacity, ok := dict.Category(name); !ok || refill != want[0] || capacity != want[1] {
			t.Errorf("category %s: %d a minute, %d at most (%v), want %v", name, refill, capacity, ok, want)
		}
	}
	if _, _, ok := dict.Category("Z"); ok {
		t.Error("category Z exists")
	}
}

// TestAScannerDrainsItsOwnBucketFirst: a person's five misses, each asked then charged as the
// rules say (payer first), empty the person's bucket and cost the bank's 15 tokens; the sixth
// is refused by the person's bucket, and costs the bank nothing more.
func TestAScannerDrainsItsOwnBucketFirst(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(func(o *redis.Options) { ratelimit.ClientOptions(o, time.Second) })
	l, err := ratelimit.New(rdb, ratelimit.Options{KeySecret: []byte("a test secret of 32 bytes, long."), Timeout: time.Second,
		Sequences: sequence.New(rdb)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// The limiter reads Redis's clock here: buckets that refill one token an hour keep the
	// counts exact however long the test takes.
	rules := rules
	rules.Payer.Policy.Window, rules.Payer.Policy.Limit = time.Hour, 1
	rules.Participant.Policy.Window, rules.Participant.Policy.Limit = time.Hour, 1
	scanner := dict.Payer{ID: "scanner"}
	limit, id := rules.PayerBucket(scanner, pix.KeyEmail)
	payer := ratelimit.Check{Policy: limit.Policy, Identity: id}
	blimit, bid := rules.ParticipantBucket()
	bank := ratelimit.Check{Policy: blimit.Policy, Identity: bid}
	misses := 0
	for range 6 {
		p, b := rules.Price(false)
		chargeBank := ratelimit.ChargeStep(bank, b)
		ds, err := l.Decide(ctx, ratelimit.AskStep(payer, bank), ratelimit.ChargeStep(payer, p), chargeBank)
		if err != nil {
			t.Fatal(err)
		}
		if d, ran := ds.Of(chargeBank); ran && d.Allowed {
			misses++
		}
	}
	ds, err := l.Decide(ctx, ratelimit.AskStep(bank))
	d := ds.Last()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := misses, 5; got != want {
		t.Errorf("%d misses answered, want %d", got, want)
	}
	if got, want := blimit.Policy.Capacity()-d.Worst.Remaining, 15; got != want {
		t.Errorf("the bank's bucket paid %d tokens, want %d", got, want)
	}
}
