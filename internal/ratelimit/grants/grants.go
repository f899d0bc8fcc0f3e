// Package grants owns vouchers: something a request is granted now that a later request may
// redeem once, fleet-wide, within a lifetime (a key look-up that a payment turns into a refund
// of its tokens, as DICT gives them back).
//
// What it buys: a refund only for what was paid (no request can redeem twice, nor one never
// granted, even two replicas at once). What it costs: a sorted set per identity of at most Max
// grants, and a step more where it is granted and where it is redeemed (on one Redis they ride in
// those requests' other calls: package sequence). Vouchers bypass the deny cache (a key with no
// voucher is no full key), and the outage fallback decides none (a voucher that cannot be
// reached costs a refund, nothing more).
//
// Its script is voucher.lua, generated from lua/voucher.lua with the algorithms' prelude, so
// that the same body runs alone and in a sequence's script.
package grants

import (
	_ "embed"
	"time"

	"github.com/pixlimit/pixlimit/internal/ratelimit"
	"github.com/redis/go-redis/v9"
)

//go:embed voucher.lua
var source string

// Script is voucher.lua, which grants and redeems alone: what package warm loads.
func Script() *redis.Script { return script }

var script = redis.NewScript(source)

// Vouchers are an identity's grants: at most Max of them held (past it the oldest are dropped),
// each redeemable within Lifetime of its grant. Name names their keys.
type Vouchers struct {
	Name     string
	Max      int
	Lifetime time.Duration
}

// Grant records a voucher for identity, named afresh each time it is decided. It is never refused.
func (v Vouchers) Grant(identity string) ratelimit.Step {
	return &step{v.check(identity), true, ratelimit.GiveOp(1)}
}

// Redeem takes one of identity's vouchers: admitted when it took one, refused (ending a
// Decide's steps) when there was none. Each is redeemed once.
func (v Vouchers) Redeem(identity string) ratelimit.Step {
	return &step{v.check(identity), false, ratelimit.TakeOp()}
}

// check is the vouchers' key and settings as a step's check: the most grants as its limit, their
// lifetime as its window (what voucher.lua reads).
func (v Vouchers) check(identity string) ratelimit.Check {
	return ratelimit.Check{Policy: ratelimit.Policy{Name: v.Name, Limit: v.Max, Window: v.Lifetime}, Identity: identity}
}

// step is a grant or a redemption of one voucher.
type step struct {
	c     ratelimit.Check
	grant bool
	op    ratelimit.Op
}

func (s *step) Checks() []ratelimit.Check { return []ratelimit.Check{s.c} }

// Script: a grant is named afresh by each call (one step decided twice grants two); a key with
// no voucher is no full key, so a deny cache never remembers one.
func (s *step) Script() ratelimit.StepScript {
	return ratelimit.StepScript{Body: "voucher", Alone: script, NewID: s.grant, Op: s.op}
}
