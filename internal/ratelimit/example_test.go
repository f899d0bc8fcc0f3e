package ratelimit_test

import (
	"context"
	"fmt"
	"log"
	"net/netip"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pixlimit/pixlimit/internal/memredis"
	"github.com/pixlimit/pixlimit/internal/ratelimit"
)

// newLimiter is a Limiter over an embedded Redis; a fleet gives every replica the same real one
// (redis.ParseURL, then ratelimit.ClientOptions) and the same KeySecret.
func newLimiter() (*ratelimit.Limiter, func()) {
	srv, err := memredis.Start()
	if err != nil {
		log.Fatal(err)
	}
	opt := &redis.Options{Addr: srv.Addr()}
	ratelimit.ClientOptions(opt, time.Second)
	rdb := redis.NewClient(opt)
	l, err := ratelimit.New(rdb, ratelimit.Options{KeySecret: []byte("one secret for the whole fleet!!"), Timeout: time.Second})
	if err != nil {
		log.Fatal(err)
	}
	return l, func() { rdb.Close(); srv.Close() }
}

// A decision: three PIX a minute per account. The fourth is refused, and a refusal is never
// recorded.
func ExampleLimiter_AllowAll() {
	l, stop := newLimiter()
	defer stop()
	pix := ratelimit.Policy{Name: "pix", Limit: 3, Window: time.Minute}
	for range 4 {
		d, err := l.AllowAll(context.Background(), ratelimit.Check{Policy: pix, Identity: "acct-ana"})
		if err != nil {
			log.Fatal(err) // wraps ratelimit.ErrUnavailable: the caller applies its fail mode
		}
		fmt.Println(d.Allowed, d.Worst.Remaining)
	}
	// Output:
	// true 2
	// true 1
	// true 0
	// false 0
}

// Two keys in one decision: a login counts against its client IP and the document it tries,
// atomically. Once the document's key is full, a login from a fresh IP is refused too, and the
// IP's key records nothing of it.
func ExampleLimiter_AllowAll_twoKeys() {
	l, stop := newLimiter()
	defer stop()
	ip := ratelimit.Policy{Name: "login-ip", Limit: 10, Window: 10 * time.Minute}
	document := ratelimit.Policy{Name: "login-account", Limit: 2, Window: 10 * time.Minute}
	login := func(addr string) ratelimit.Decision {
		d, err := l.AllowAll(context.Background(),
			ratelimit.Check{Policy: ip, Identity: ratelimit.IPIdentity(netip.MustParseAddr(addr))},
			ratelimit.Check{Policy: document, Identity: "52998224725"})
		if err != nil {
			log.Fatal(err)
		}
		return d
	}
	login("203.0.113.7")
	login("203.0.113.8")
	d := login("198.51.100.9")
	fmt.Println("allowed:", d.Allowed, "refused by:", d.Worst.Policy.Name)
	fmt.Println("the new IP's key still has:", d.Results[0].Remaining)
	// Output:
	// allowed: false refused by: login-account
	// the new IP's key still has: 10
}

// Reading Retry-After: a refusal says when the full key has room again, to the microsecond; an
// HTTP answer rounds it up to whole seconds, so a client that waits what it is told is never
// early.
func ExampleDecision_retryAfter() {
	l, stop := newLimiter()
	defer stop()
	statement := ratelimit.Check{Policy: ratelimit.Policy{Name: "statement", Limit: 1, Window: 30 * time.Second}, Identity: "acct-ana"}
	l.AllowAll(context.Background(), statement)
	d, err := l.AllowAll(context.Background(), statement)
	if err != nil {
		log.Fatal(err)
	}
	seconds := (d.Worst.RetryAfter + time.Second - 1) / time.Second
	fmt.Println("allowed:", d.Allowed)
	fmt.Println("Retry-After:", int(seconds))
	// Output:
	// allowed: false
	// Retry-After: 30
}
