package denycache

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pixlimit/pixlimit/internal/ratelimit"
	"github.com/pixlimit/pixlimit/internal/testing/clocktest"
	"github.com/pixlimit/pixlimit/internal/testing/redistest"
)

var testSecret = []byte("0123456789abcdef0123456789abcdef")

// generous is a budget no loaded machine outlasts: a timeout is not what these tests test.
const generous = time.Second

// replica is a Limiter, and the deny cache in front of it when c is not nil.
type replica struct {
	l *ratelimit.Limiter
	c *Cache
}

// decider is the cache, if any, else the Limiter.
func (r replica) decider() ratelimit.Decider {
	if r.c != nil {
		return r.c
	}
	return r.l
}

// allow decides checks through the cache, if any, failing the test on an error.
func (r replica) allow(t *testing.T, checks ...ratelimit.Check) ratelimit.Decision {
	t.Helper()
	d, err := r.decider().AllowAll(context.Background(), checks...)
	if err != nil {
		t.Fatalf("AllowAll: %v", err)
	}
	return d
}

// fleet is n replicas on srv, on clock clk (nil: the real one), their keys under prefix ("": the
// default), each with a deny cache of opts (nil: none).
func fleet(t *testing.T, srv *redistest.Server, prefix string, n int, clk *clocktest.Clock, opts *Options) []replica {
	t.Helper()
	rs := make([]replica, n)
	for i := range rs {
		rdb := srv.Client(func(o *redis.Options) { ratelimit.ClientOptions(o, generous) })
		lo := ratelimit.Options{KeySecret: testSecret, Timeout: generous, Prefix: prefix}
		if clk != nil {
			lo.Now = clk.Now
		}
		l, err := ratelimit.New(rdb, lo)
		if err != nil {
			t.Fatal(err)
		}
		rs[i].l = l
		if opts != nil {
			o := *opts
			if clk != nil {
				o.Now = clk.Now
			}
			c, err := New(l, rdb, prefix, o)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Close() })
			rs[i].c = c
		}
	}
	return rs
}

// sameWait allows the sliding window its one microsecond of integer rounding, which may fall on
// either side once the deadline crosses into the next calendar window.
func sameWait(a, b time.Duration) bool { return (a - b).Abs() <= time.Microsecond }

func sameResult(a, b ratelimit.Result) bool {
	return a.Policy == b.Policy && a.Remaining == b.Remaining && sameWait(a.Reset, b.Reset) && sameWait(a.RetryAfter, b.RetryAfter)
}

// TestTheDenyCacheDecidesAsRedisDoes drives the same random trace through two fleets of three
// replicas over one real Redis, one with the deny cache and one without, for every algorithm:
// many identities, one- and two-key decisions, injected time with jumps short and long. Every
// decision must be the same: the verdict always, and the key reported with its Remaining, Reset
// and Retry-After whenever the cached fleet asked Redis; when its deny cache refused, every key it
// reports blocked must be full in the uncached fleet with the same Retry-After. The cache must
// also have answered a good share of the refusals, or the test proves nothing.
func TestTheDenyCacheDecidesAsRedisDoes(t *testing.T) {
	srv := redistest.Start(t)
	for _, a := range ratelimit.Algorithms() {
		if a == ratelimit.LeakyBucket {
			continue // a queue: its places leave early (package ratelimit's queue tests)
		}
		t.Run(string(a), func(t *testing.T) {
			t.Parallel()
			clk := clocktest.New()
			plain := fleet(t, srv, "plain-"+string(a), 3, clk, nil)
			cached := fleet(t, srv, "cached-"+string(a), 3, clk, &Options{Size: 1000})
			pa := ratelimit.Policy{Name: "a", Limit: 4, Window: 10 * time.Second, Algorithm: a}
			pb := ratelimit.Policy{Name: "b", Limit: 3, Window: 7 * time.Second, Algorithm: a}
			if a.Bursty() {
				pa.Burst = 6
			}
			rng := rand.New(rand.NewPCG(13, uint64(len(a))))
			cachedRefusals, refused := 0, 0
			for step := range 4000 {
				clk.Wander(rng, 300*time.Millisecond, 12*time.Second)
				x, y := fmt.Sprint(rng.IntN(3)), fmt.Sprint(rng.IntN(3))
				var checks []ratelimit.Check
				switch rng.IntN(3) {
				case 0:
					checks = []ratelimit.Check{{Policy: pa, Identity: x}}
				case 1:
					checks = []ratelimit.Check{{Policy: pb, Identity: y}}
				default:
					checks = []ratelimit.Check{{Policy: pa, Identity: x}, {Policy: pb, Identity: y}}
				}
				replica := rng.IntN(3)
				want := plain[replica].allow(t, checks...)
				got := cached[replica].allow(t, checks...)
				if got.Allowed != want.Allowed {
					t.Fatalf("step %d %v: cached allowed=%v (deny-cached=%v), Redis alone %v", step, checks, got.Allowed, got.DenyCached, want.Allowed)
				}
				if !want.Allowed {
					refused++
				}
				if !got.DenyCached {
					if !sameResult(got.Worst, want.Worst) {
						t.Fatalf("step %d: cached reports %+v, Redis alone %+v", step, got.Worst, want.Worst)
					}
					continue
				}
				cachedRefusals++
				for i, r := range got.Results {
					if r.RetryAfter == 0 {
						continue // not known to be full: nothing was asked of it
					}
					if w := want.Results[i]; w.Remaining != 0 || !sameWait(r.RetryAfter, w.RetryAfter) {
						t.Fatalf("step %d key %d: refused by the deny cache for %v, Redis alone says remaining %d, retry after %v",
							step, i, r.RetryAfter, w.Remaining, w.RetryAfter)
					}
				}
			}
			t.Logf("%d decisions, %d refused, %d of them by the deny cache", 4000, refused, cachedRefusals)
			if refused < 800 || cachedRefusals < refused/4 {
				t.Errorf("%d refused, %d by the deny cache: the trace did not exercise the cache", refused, cachedRefusals)
			}
		})
	}
}

// TestADenyCachedKeyIsRefusedWhileRedisIsDown: a key this replica's deny cache knows to be full
// is refused as rate_limit_exceeded, with its wait counting down, with no Redis at all; another
// key gets ErrUnavailable.
func TestADenyCachedKeyIsRefusedWhileRedisIsDown(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	r := fleet(t, srv, "", 1, nil, &Options{})[0] // a killed Redis refuses at once: no budget to wait out
	p := ratelimit.Policy{Name: "pix", Limit: 2, Window: time.Minute}
	ana := ratelimit.Check{Policy: p, Identity: "ana"}
	for range 2 {
		r.allow(t, ana)
	}
	first := r.allow(t, ana)
	if first.Allowed || first.DenyCached {
		t.Fatalf("3rd request: allowed=%v deny-cached=%v, want refused by Redis", first.Allowed, first.DenyCached)
	}
	srv.Kill()
	before, cached := r.l.Stats(), r.c.Stats()
	d, err := r.c.AllowAll(context.Background(), ana)
	if err != nil || d.Allowed || !d.DenyCached || d.Worst.RetryAfter <= 0 || d.Worst.RetryAfter > first.Worst.RetryAfter {
		t.Fatalf("with Redis down: %+v, %v; want refused by the deny cache, waiting at most %v", d, err, first.Worst.RetryAfter)
	}
	if after := r.l.Stats(); after.Redis != before.Redis || r.c.Stats().Refused != cached.Refused+1 {
		t.Errorf("stats %+v after %+v, the cache's %+v after %+v: want one deny-cache refusal and no Redis call", after, before, r.c.Stats(), cached)
	}
	if _, err := r.c.AllowAll(context.Background(), ratelimit.Check{Policy: p, Identity: "bruno"}); err == nil {
		t.Error("another key with Redis down: no error, want ErrUnavailable")
	}
}

// TestARefusalLearntUnderAFormerPolicyRefusesNothing: a key the cache learnt full under one policy
// (a limit of 2) is asked of Redis, not refused from memory, when checked under another of the
// same name (the account's new tier: a limit of 5), however the refusal and the tier's change
// raced; under the first policy it is still refused from memory.
func TestARefusalLearntUnderAFormerPolicyRefusesNothing(t *testing.T) {
	t.Parallel()
	r := fleet(t, redistest.Start(t), "", 1, nil, &Options{})[0]
	former := ratelimit.Policy{Name: "pix", Limit: 2, Window: time.Minute}
	raised := former
	raised.Limit = 5
	for range 3 {
		r.allow(t, ratelimit.Check{Policy: former, Identity: "ana"})
	}
	if d, full := r.c.KnownFull(ratelimit.Check{Policy: former, Identity: "ana"}); !full || !d.DenyCached {
		t.Fatalf("under the policy that refused: known full %v, want true", full)
	}
	if d := r.allow(t, ratelimit.Check{Policy: raised, Identity: "ana"}); !d.Allowed || d.DenyCached || d.Worst.Remaining != 2 {
		t.Errorf("under the raised policy: %+v, want admitted by Redis with 2 remaining (3 of 5 used)", d)
	}
}

// TestDenyCacheIsBounded: at its size the cache drops what expires soonest, expired entries
// first, and stays at its size.
func TestDenyCacheIsBounded(t *testing.T) {
	t.Parallel()
	now := time.Now()
	c := newEntries(3)
	c.block("expired", ratelimit.Check{Identity: "expired"}, 0, now.Add(-time.Second), now.Add(-time.Second))
	c.block("soon", ratelimit.Check{Identity: "soon"}, 0, now.Add(time.Second), now.Add(time.Second))
	c.block("late", ratelimit.Check{Identity: "late"}, 0, now.Add(time.Hour), now.Add(time.Hour))
	c.block("new", ratelimit.Check{Identity: "new"}, 0, now.Add(time.Minute), now.Add(time.Minute)) // pushes out "expired"
	c.block("newer", ratelimit.Check{Identity: "newer"}, 0, now.Add(time.Minute), now.Add(time.Minute))
	if c.len() != 3 {
		t.Fatalf("%d entries, want 3", c.len())
	}
	for key, want := range map[string]bool{"expired": false, "soon": false, "late": true, "new": true, "newer": true} {
		if _, got := c.blockedUntil(ratelimit.Check{Identity: key}, now); got != want {
			t.Errorf("%s blocked = %v, want %v", key, got, want)
		}
	}
}

// TestAnEntryIsFoundByItsCheckUntilItGoes: an entry is found by the check that names its key,
// under either spelling of the default algorithm (the last it was learnt under), and goes from
// both of its maps and its heap together, whether forgotten by key, evicted or expired.
func TestAnEntryIsFoundByItsCheckUntilItGoes(t *testing.T) {
	t.Parallel()
	now := time.Now()
	c := newEntries(2)
	sizes := func(step string, want int) {
		t.Helper()
		if len(c.entries) != want || len(c.byCheck) != want || len(c.byUntil) != want {
			t.Errorf("%s: %d by key, %d by check, %d in the heap, want %d each", step, len(c.entries), len(c.byCheck), len(c.byUntil), want)
		}
	}
	unnamed := ratelimit.Check{Policy: ratelimit.Policy{Name: "p", Limit: 1, Window: time.Minute}, Identity: "ana"}
	named := unnamed
	named.Policy.Algorithm = ratelimit.SlidingLog // the same Redis key
	c.block("k-ana", unnamed, 0, now.Add(time.Minute), now.Add(time.Minute))
	c.block("k-ana", named, 0, now.Add(time.Minute), now.Add(time.Minute))
	sizes("one key learnt under both spellings", 1)
	if _, ok := c.blockedUntil(named, now); !ok {
		t.Error("the entry is not found by the check it was last learnt under")
	}
	c.forget(now, "k-ana")
	sizes("forgotten by key", 0)
	if _, ok := c.blockedUntil(named, now); ok {
		t.Error("a forgotten key is still found by its check")
	}
	for i, id := range []string{"a", "b", "c"} { // the third evicts the first, which expires soonest
		ch := unnamed
		ch.Identity = id
		c.block("k-"+id, ch, 0, now.Add(time.Duration(i+1)*time.Minute), now.Add(time.Hour))
	}
	sizes("full, one evicted", 2)
	if _, ok := c.blockedUntil(ratelimit.Check{Policy: unnamed.Policy, Identity: "a"}, now); ok {
		t.Error("an evicted entry is still found by its check")
	}
	if _, ok := c.blockedUntil(ratelimit.Check{Policy: unnamed.Policy, Identity: "b"}, now.Add(time.Hour)); ok {
		t.Error("an expired entry answers")
	}
	sizes("one expired", 1)
}

// TestDenyCacheMemory measures the bytes per entry that the package documentation states: the
// entry with its key and its identity (a CPF), which it keeps after the request that taught it.
func TestDenyCacheMemory(t *testing.T) {
	const n = 100_000
	l := fleet(t, redistest.Start(t), "", 1, nil, nil)[0].l
	p := ratelimit.Policy{Name: "login-account", Limit: 5, Window: time.Minute}
	var c *entries
	per := heapGrowth(func() {
		c = newEntries(n)
		until := time.Now().Add(time.Hour)
		for i := range n {
			ch := ratelimit.Check{Policy: p, Identity: fmt.Sprintf("%011d", 52998224725+i)}
			c.block(l.Key(ch), ch, 0, until, until)
		}
	}) / n
	t.Logf("%.0f bytes per entry, its key and CPF included: %.1f MB for %d", per, per*n/1e6, n)
	if per > 420 {
		t.Errorf("%.0f bytes per entry, want at most 420 (the package documentation's entry, with its key and identity)", per)
	}

	// The forgets it remembers beside them: as many, of other keys (a refund's, a desk's).
	keys := make([]string, n) // made before measuring: a forget keeps the caller's key
	for i := range keys {
		keys[i] = l.Key(ratelimit.Check{Policy: p, Identity: fmt.Sprintf("%011d", 62998224725+i)})
	}
	perForget := heapGrowth(func() {
		now := time.Now()
		for _, key := range keys {
			c.forget(now, key)
		}
	}) / n
	t.Logf("%.0f bytes per forget remembered, its key not included: %.1f MB for %d", perForget, perForget*n/1e6, n)
	if perForget > 110 {
		t.Errorf("%.0f bytes per forget, want at most 110 (entries' documentation: about 95)", perForget)
	}
	runtime.KeepAlive(c)
	runtime.KeepAlive(keys)
}

// heapGrowth is how much the live heap grew while fn ran, in bytes, collected before and after.
func heapGrowth(fn func()) float64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	fn()
	runtime.GC()
	runtime.ReadMemStats(&after)
	return float64(after.HeapAlloc) - float64(before.HeapAlloc)
}

// TestForgetUnblocksEveryReplica: a key both replicas hold as full in their deny caches is
// forgotten on one: that one admits at once, and the other as soon as the fleet's channel tells
// it (it would otherwise keep refusing from memory for the hold, a minute here), without asking
// Redis first.
func TestForgetUnblocksEveryReplica(t *testing.T) {
	t.Parallel()
	rs := fleet(t, redistest.Start(t), "", 2, nil, &Options{Hold: time.Minute})
	a, b := rs[0], rs[1]
	c := ratelimit.Check{Policy: ratelimit.Policy{Name: "login-account", Limit: 1, Window: time.Minute}, Identity: "52998224725"}
	a.allow(t, c)
	for _, r := range rs {
		if d := r.allow(t, c); d.Allowed {
			t.Fatal("the second request was admitted")
		}
		if d := r.allow(t, c); d.Allowed || !d.DenyCached {
			t.Fatalf("the third: %+v, want refused from the deny cache", d)
		}
	}
	if err := a.c.Forget(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	if d := a.allow(t, c); !d.Allowed {
		t.Fatalf("on the replica that forgot: %+v, want admitted at once", d)
	}
	if err := a.c.Forget(context.Background(), c); err != nil { // for b's turn, the key is empty again
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		d := b.allow(t, c)
		if d.Allowed {
			break
		}
		if !d.DenyCached {
			t.Fatalf("the other replica asked Redis and was refused: %+v", d)
		}
		if time.Now().After(deadline) {
			t.Fatal("the other replica still refuses from memory 5 s after the key was forgotten")
		}
		time.Sleep(20 * time.Millisecond) // the message's way: a round trip
	}
}

// TestTheCacheLearnsDebtAndForgetsRefunds: an admission that leaves a token bucket in debt teaches
// the cache (the next request is refused from memory); a refund through the cache clears the key
// here at once (the next request asks Redis, which admits it); an ask of the Limiter beneath the
// cache teaches it nothing.
func TestTheCacheLearnsDebtAndForgetsRefunds(t *testing.T) {
	t.Parallel()
	clk := clocktest.New() // time stands still: no refill
	r := fleet(t, redistest.Start(t), "", 1, clk, &Options{})[0]
	ctx := context.Background()
	c := ratelimit.Check{Policy: ratelimit.Policy{Name: "pix-lookup", Limit: 2, Window: time.Minute, Algorithm: ratelimit.TokenBucket, Burst: 3}, Identity: "payer"}
	if ds, err := r.c.Decide(ctx, ratelimit.ChargeStep(c, 5)); err != nil || !ds.Last().Allowed {
		t.Fatalf("a charge of 5 of 3 tokens: %+v, %v; want admitted into debt", ds.Last(), err)
	}
	if d := r.allow(t, c); d.Allowed || !d.DenyCached {
		t.Fatalf("after the debt: %+v, want refused from memory", d)
	}
	if _, err := r.c.Decide(ctx, ratelimit.RefundStep(3, c)); err != nil {
		t.Fatal(err)
	}
	if d := r.allow(t, c); !d.Allowed || d.DenyCached {
		t.Fatalf("after a refund of 3: %+v, want Redis to admit it", d)
	}
	r.allow(t, c) // empty again: refused by Redis, learnt
	if n := r.c.Stats().Keys; n != 1 {
		t.Fatalf("the cache holds %d keys, want 1", n)
	}
	r.c.Forgotten(c)
	if ds, err := r.l.Decide(ctx, ratelimit.AskStep(c)); err != nil || ds.Last().Allowed {
		t.Fatalf("asking the Limiter beneath: %+v, %v; want refused", ds.Last(), err)
	}
	if n := r.c.Stats().Keys; n != 0 {
		t.Errorf("the cache holds %d keys after an ask beneath it, want 0", n)
	}
}

// cacheOn is a Limiter on srv (a client with opts, when given), its scripts run by runner (nil:
// the default) on clk (nil: the real clock), behind a deny cache that holds a block a minute.
func cacheOn(t *testing.T, srv *redistest.Server, runner ratelimit.Runner, clk *clocktest.Clock, opts ...func(*redis.Options)) (*ratelimit.Limiter, *Cache) {
	t.Helper()
	rdb := srv.Client(func(o *redis.Options) {
		ratelimit.ClientOptions(o, generous)
		for _, opt := range opts {
			opt(o)
		}
	})
	lo, co := ratelimit.Options{KeySecret: testSecret, Timeout: generous, Runner: runner}, Options{Hold: time.Minute}
	if clk != nil {
		lo.Now, co.Now = clk.Now, clk.Now
	}
	l, err := ratelimit.New(rdb, lo)
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(l, rdb, "", co)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return l, c
}

// TestAKeyForgottenButNotAnnouncedIsForgotten: when the announcement to the other replicas fails
// (here Redis refuses the client PUBLISH), the key is still forgotten, in Redis and here, and
// Forget says just that (ErrNotAnnounced), not that nothing changed.
func TestAKeyForgottenButNotAnnouncedIsForgotten(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	admin := srv.Client(nil)
	if err := admin.Do(t.Context(), "ACL", "SETUSER", "nopublish", "on", ">a-test-password", "+@all", "-publish", "~*", "&*").Err(); err != nil {
		t.Fatal(err)
	}
	l, c := cacheOn(t, srv, nil, nil, func(o *redis.Options) { o.Username, o.Password = "nopublish", "a-test-password" })
	ch := ratelimit.Check{Policy: ratelimit.Policy{Name: "login-account", Limit: 1, Window: time.Minute}, Identity: "52998224725"}
	for range 3 { // admitted, refused by Redis, refused from memory
		if _, err := c.AllowAll(t.Context(), ch); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Forget(t.Context(), ch); !errors.Is(err, ErrNotAnnounced) {
		t.Fatalf("Forget without PUBLISH: %v, want ErrNotAnnounced", err)
	}
	if n, err := admin.Exists(t.Context(), l.Key(ch)).Result(); err != nil || n != 0 {
		t.Errorf("the key in Redis after Forget: %d (%v), want gone", n, err)
	}
	if d, err := c.AllowAll(t.Context(), ch); err != nil || !d.Allowed || d.DenyCached {
		t.Errorf("the next request here: %+v, %v, want admitted by Redis", d, err)
	}
}

// gated is a Runner whose next call, once a gate is set, stops at it: before Redis runs it
// (before) or after, its reply held; it says so on arrived and goes on when open is closed.
type gated struct {
	next ratelimit.Runner
	gate atomic.Pointer[gate]
}

type gate struct {
	before        bool
	arrived, open chan struct{}
}

// stop sets a gate for the next call, before Redis runs it or after, and returns it.
func (g *gated) stop(before bool) *gate {
	gt := &gate{before: before, arrived: make(chan struct{}), open: make(chan struct{})}
	g.gate.Store(gt)
	return gt
}

func (g *gated) Run(ctx context.Context, a ratelimit.Algorithm, keys []string, c ratelimit.Call) (ratelimit.Reply, error) {
	gt := g.gate.Swap(nil)
	wait := func() { close(gt.arrived); <-gt.open }
	if gt != nil && gt.before {
		wait()
	}
	r, err := g.next.Run(ctx, a, keys, c)
	if gt != nil && !gt.before {
		wait()
	}
	return r, err
}

// TestARefusalComingBackAfterAForgetBlocksNothing: Redis refuses a request, the desk clears the
// key (Forget) while that refusal is on its way back, and the refusal then arrives: the cache does
// not learn it, since Redis decided it before the forget. The next request is Redis's to decide,
// and Redis admits it. Before, the cache blocked the key again for the hold and told the customer
// to wait the whole window. The clock stands still: the forget is told from the refusal by
// number, not by time.
func TestARefusalComingBackAfterAForgetBlocksNothing(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	runner := &gated{next: ratelimit.Scripts(srv.Client(nil))}
	_, c := cacheOn(t, srv, runner, clocktest.New())
	ch := ratelimit.Check{Policy: ratelimit.Policy{Name: "login-account", Limit: 2, Window: 10 * time.Minute}, Identity: "52998224725"}
	for range 2 {
		if d, err := c.AllowAll(t.Context(), ch); err != nil || !d.Allowed {
			t.Fatalf("under the limit: %+v, %v", d, err)
		}
	}
	held := runner.stop(false)
	refused := make(chan ratelimit.Decision, 1)
	go func() {
		d, _ := c.AllowAll(context.Background(), ch)
		refused <- d
	}()
	<-held.arrived // Redis has refused it; its answer waits
	if err := c.Forget(t.Context(), ch); err != nil {
		t.Fatal(err)
	}
	close(held.open)
	if d := <-refused; d.Allowed {
		t.Fatalf("the request decided before the forget: %+v, want refused", d)
	}
	if d, err := c.AllowAll(t.Context(), ch); err != nil || !d.Allowed || d.DenyCached {
		t.Errorf("after the desk cleared the key: %+v, %v; want admitted by Redis, not refused from memory", d, err)
	}
}

// TestARefusalDecidedBeforeARefundBlocksNothing: a refund is on its way to Redis; a request on
// its key, sent after the refund was, is refused by Redis before the refund runs, and its answer
// comes back after the refund's. The cache does not learn it: the refund made room, and Redis
// admits the next request. (The forget made as the refund is sent does not cover this request:
// the one made once it has run does.)
func TestARefusalDecidedBeforeARefundBlocksNothing(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	runner := &gated{next: ratelimit.Scripts(srv.Client(nil))}
	_, c := cacheOn(t, srv, runner, clocktest.New()) // time stands still: no refill
	ctx := context.Background()
	ch := ratelimit.Check{Policy: ratelimit.Policy{Name: "pix-lookup", Limit: 2, Window: time.Minute, Algorithm: ratelimit.TokenBucket, Burst: 2}, Identity: "payer"}
	if ds, err := c.Decide(ctx, ratelimit.ChargeStep(ch, 2)); err != nil || !ds.Last().Allowed {
		t.Fatalf("a charge of the bucket's 2 tokens: %+v, %v", ds.Last(), err)
	}
	sending := runner.stop(true)
	refunded := make(chan error, 1)
	go func() {
		_, err := c.Decide(ctx, ratelimit.RefundStep(1, ch))
		refunded <- err
	}()
	<-sending.arrived // the refund is on its way, not yet run
	held := runner.stop(false)
	refused := make(chan ratelimit.Decision, 1)
	go func() {
		d, _ := c.AllowAll(ctx, ch)
		refused <- d
	}()
	<-held.arrived // Redis has refused it (the bucket is empty); its answer waits
	close(sending.open)
	if err := <-refunded; err != nil {
		t.Fatal(err)
	}
	close(held.open)
	if d := <-refused; d.Allowed {
		t.Fatalf("the request decided before the refund: %+v, want refused", d)
	}
	if d, err := c.AllowAll(ctx, ch); err != nil || !d.Allowed || d.DenyCached {
		t.Errorf("after the refund: %+v, %v; want admitted by Redis, not refused from memory", d, err)
	}
}

// TestAForgetIsRememberedWhileADecisionMayBeOnItsWay: a decision that saw fewer forgets than its
// key's last is not learnt, one that saw it is; a key forgotten again and again lets go only its
// own older forgets; a forget let go (past the cache's size, or past forgetMemory) still keeps
// every decision that did not see it from being learnt.
func TestAForgetIsRememberedWhileADecisionMayBeOnItsWay(t *testing.T) {
	t.Parallel()
	now := time.Now()
	later := now.Add(time.Hour)
	c := newEntries(2)
	blocked := func(id string) bool { _, ok := c.blockedUntil(ratelimit.Check{Identity: id}, now); return ok }
	block := func(id string, seen uint64) { c.block(id, ratelimit.Check{Identity: id}, seen, later, later) }

	before := c.seen()
	c.forget(now, "ana") // 1
	block("ana", before)
	if blocked("ana") {
		t.Error("a refusal that did not see the key's forget was learnt")
	}
	block("ana", c.seen())
	if !blocked("ana") {
		t.Error("a refusal that saw the forget was not learnt")
	}

	for range 3 {
		c.forget(now, "bank") // 2, 3, 4: a refund's key; "ana"'s 1 let go for room
	}
	block("bia", 1) // saw "ana"'s: learnt, whatever "bank"'s forgets let go
	if !blocked("bia") {
		t.Error("a refusal was not learnt after one key's forgets filled the memory")
	}
	block("cara", 0) // did not see "ana"'s, let go
	if blocked("cara") {
		t.Error("a refusal that did not see a forget let go for room was learnt")
	}

	c.forget(now.Add(forgetMemory+time.Second), "zé") // 5: "bank"'s 3 and 4 let go for age
	block("dan", 4)
	block("eve", 3)
	if !blocked("dan") || blocked("eve") {
		t.Errorf("dan (saw 4) blocked %v, eve (saw 3) blocked %v; want true and false", blocked("dan"), blocked("eve"))
	}
	if len(c.forgotten) != 1 || len(c.recent) != 1 {
		t.Errorf("%d keys and %d forgets remembered, want 1 and 1", len(c.forgotten), len(c.recent))
	}
}

// TestAQueuesRefusalIsNotLearnt: a queue (leaky_bucket, a turn every 10 s, 5 places) refuses a
// request whose turn would come after its own deadline (3 s away) while places are free; a
// request a second later without that deadline is admitted by Redis, and so by a replica with
// the cache: a queue's refusal says nothing of the next request, and is not learnt.
func TestAQueuesRefusalIsNotLearnt(t *testing.T) {
	clk := clocktest.New()
	srv := redistest.Start(t)
	cached := fleet(t, srv, "cached", 1, clk, &Options{})[0]
	plain := fleet(t, srv, "plain", 1, clk, nil)[0]
	c := ratelimit.Check{Policy: ratelimit.Policy{Name: "payroll", Limit: 1, Window: 10 * time.Second,
		Algorithm: ratelimit.LeakyBucket, Queue: 5}, Identity: "bakery"}
	for _, r := range []replica{cached, plain} {
		for i := range 2 { // turns now and 10 s from now
			if d := r.allow(t, c); !d.Allowed {
				t.Fatalf("request %d: refused, want a turn", i+1)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), generous+3*time.Second) // its turn, 20 s away, is too late
		d, err := r.decider().AllowAll(ctx, c)
		cancel()
		if err != nil || d.Allowed {
			t.Fatalf("a request that may wait 3 s for a turn 20 s away: %+v, %v; want refused", d, err)
		}
	}
	clk.Add(time.Second)
	if want, got := plain.allow(t, c), cached.allow(t, c); !want.Allowed || !got.Allowed {
		t.Errorf("a request without that deadline, a second later: Redis alone admitted %v, the cache's replica %v (deny-cached %v, Retry-After %v); want both admitted",
			want.Allowed, got.Allowed, got.DenyCached, got.Worst.RetryAfter)
	}
}
