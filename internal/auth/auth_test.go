package auth

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"net/http/httptest"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/golang-jwt/jwt/v5"
	"github.com/labstack/echo/v4"

	"github.com/pixlimit/pixlimit/internal/pix"
)

var secret = []byte("0123456789abcdef0123456789abcdef")

func TestTokens(t *testing.T) {
	tokens, err := NewTokens(secret, 15*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	tokens.now = func() time.Time { return now }
	good, err := tokens.Issue(Subject{Account: "acct-ana", Payer: "payer-ana", Person: "PF"})
	if err != nil {
		t.Fatal(err)
	}
	if s, err := tokens.Verify(good); err != nil || s.ID == "" || s != (Subject{Account: "acct-ana", Payer: "payer-ana", Person: "PF", ID: s.ID, IssuedAt: now}) {
		t.Fatalf("Verify(issued) = %+v, %v", s, err)
	}
	other, _ := tokens.Issue(Subject{Account: "acct-ana", Payer: "payer-ana", Person: "PF"})
	if other == good {
		t.Error("two tokens for one account are identical: no jti")
	}

	sign := func(m jwt.SigningMethod, key any, claims jwt.Claims) string {
		s, err := jwt.NewWithClaims(m, claims).SignedString(key)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	valid := jwt.RegisteredClaims{Subject: "acct-ana", ExpiresAt: jwt.NewNumericDate(now.Add(time.Minute))}
	ec, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	forged := []struct{ name, token string }{
		{"alg none", sign(jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, valid)},
		{"HS384", sign(jwt.SigningMethodHS384, secret, valid)},
		{"ES256", sign(jwt.SigningMethodES256, ec, valid)},
		{"other secret", sign(jwt.SigningMethodHS256, []byte("another-secret-another-secret-xx"), valid)},
		{"no expiry", sign(jwt.SigningMethodHS256, secret, jwt.RegisteredClaims{Subject: "acct-ana"})},
		{"expired", sign(jwt.SigningMethodHS256, secret, jwt.RegisteredClaims{Subject: "acct-ana", ExpiresAt: jwt.NewNumericDate(now.Add(-time.Second))})},
		{"no subject", sign(jwt.SigningMethodHS256, secret, jwt.RegisteredClaims{ExpiresAt: jwt.NewNumericDate(now.Add(time.Minute))})},
		{"no payer", sign(jwt.SigningMethodHS256, tokens.secret, claims{RegisteredClaims: valid, Person: "PF"})},
		{"no person", sign(jwt.SigningMethodHS256, tokens.secret, claims{RegisteredClaims: valid, Payer: "p"})},
		{"another person", sign(jwt.SigningMethodHS256, tokens.secret, claims{RegisteredClaims: valid, Payer: "p", Person: "XX"})},
		{"tampered", good[:len(good)-2] + "xx"},
		{"the same signature, spelt otherwise", nonCanonical(t, good)},
		{"empty", ""},
	}
	for _, f := range forged {
		if id, err := tokens.Verify(f.token); !errors.Is(err, ErrUnauthorized) {
			t.Errorf("%s: Verify = %+v, %v; want ErrUnauthorized", f.name, id, err)
		}
	}
	now = now.Add(15*time.Minute + time.Second)
	if _, err := tokens.Verify(good); !errors.Is(err, ErrUnauthorized) {
		t.Errorf("after the TTL: %v, want ErrUnauthorized", err)
	}
	if _, err := NewTokens([]byte("short"), time.Minute); err == nil {
		t.Error("NewTokens with a 5-byte secret: want an error")
	}
}

// nonCanonical is token with its signature's last character changed in the bits base64url does
// not use (an HS256 signature is 32 bytes, 43 characters: the last one's two low bits are
// padding), so that a lenient decoder reads the same signature from a different string.
func nonCanonical(t *testing.T, token string) string {
	t.Helper()
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	i := strings.IndexByte(alphabet, token[len(token)-1])
	other := token[:len(token)-1] + string(alphabet[i^1])
	sig := func(tok string) []byte {
		b, err := base64.RawURLEncoding.DecodeString(tok[strings.LastIndexByte(tok, '.')+1:])
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	if !bytes.Equal(sig(token), sig(other)) {
		t.Fatalf("%q and %q decode differently: not the same signature", token, other)
	}
	return other
}

func TestRequireAccount(t *testing.T) {
	tokens, _ := NewTokens(secret, time.Minute)
	tok, _ := tokens.Issue(Subject{Account: "acct-bruno", Payer: "payer-bruno", Person: "PF"})
	h := RequireAccount(tokens, nil)(func(c echo.Context) error {
		id, err := AccountID(c)
		if err != nil {
			return err
		}
		return c.String(200, id)
	})
	for _, tt := range []struct {
		header string
		ok     bool
	}{
		{"Bearer " + tok, true},
		{"bearer " + tok, true},
		{"Bearer", false},
		{tok, false},
		{"Basic " + tok, false},
		{"", false},
	} {
		e := echo.New()
		req := httptest.NewRequest("GET", "/", nil)
		req.Header.Set("Authorization", tt.header)
		rec := httptest.NewRecorder()
		err := h(e.NewContext(req, rec))
		if tt.ok != (err == nil) || tt.ok && rec.Body.String() != "acct-bruno" {
			t.Errorf("Authorization %.20q: err %v, body %q", tt.header, err, rec.Body)
		}
	}
	// Two headers are ambiguous, whichever comes first.
	for _, headers := range [][]string{{"Bearer " + tok, "Bearer garbage"}, {"Bearer garbage", "Bearer " + tok}, {"Bearer " + tok, "Bearer " + tok}} {
		req := httptest.NewRequest("GET", "/", nil)
		for _, h := range headers {
			req.Header.Add("Authorization", h)
		}
		if err := h(echo.New().NewContext(req, httptest.NewRecorder())); !errors.Is(err, ErrUnauthorized) {
			t.Errorf("Authorization sent twice (%.20q, %.20q): %v, want ErrUnauthorized", headers[0], headers[1], err)
		}
	}
}

func TestIPExtractor(t *testing.T) {
	proxies := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	tests := []struct {
		name    string
		trusted []netip.Prefix
		peer    string
		xff     string
		want    string
	}{
		{"no proxies: the peer, header ignored", nil, "203.0.113.5:1234", "198.51.100.1", "203.0.113.5"},
		{"untrusted peer: header ignored", proxies, "203.0.113.5:1234", "198.51.100.1", "203.0.113.5"},
		{"trusted peer: the client it forwards", proxies, "10.1.1.1:1234", "198.51.100.1", "198.51.100.1"},
		{"forged hops left of the client are ignored", proxies, "10.1.1.1:1234", "1.2.3.4, 198.51.100.1", "198.51.100.1"},
		{"chained proxies are skipped", proxies, "10.1.1.1:1234", "198.51.100.1, 10.2.2.2", "198.51.100.1"},
		{"private addresses are not trusted by default", proxies, "192.168.1.1:1234", "198.51.100.1", "192.168.1.1"},
		{"loopback is not trusted by default", proxies, "127.0.0.1:1234", "198.51.100.1", "127.0.0.1"},
		{"trusted peer, no header: the peer", proxies, "10.1.1.1:1234", "", "10.1.1.1"},
		// Every hop trusted: the one our proxy appended, never one the client wrote further left
		// (Echo's extractor answers 10.9.9.9, a key the client chose).
		{"every hop trusted: the right-most", proxies, "10.1.1.1:1234", "10.9.9.9, 10.3.3.3", "10.3.3.3"},
		{"garbage left of our hops: the hop right of it", proxies, "10.1.1.1:1234", "not-an-ip, 10.3.3.3", "10.3.3.3"},
		{"garbage as the only hop: the peer", proxies, "10.1.1.1:1234", "not-an-ip", "10.1.1.1"},
		{"a hop with a port", proxies, "10.1.1.1:1234", "198.51.100.1:5555", "198.51.100.1"},
		{"a bracketed IPv6 hop", proxies, "10.1.1.1:1234", "[2001:db8::1]", "2001:db8::1"},
	}
	for _, tt := range tests {
		req := httptest.NewRequest("GET", "/", nil)
		req.RemoteAddr = tt.peer
		if tt.xff != "" {
			req.Header.Set("X-Forwarded-For", tt.xff)
		}
		if got := IPExtractor(tt.trusted)(req); got != tt.want {
			t.Errorf("%s: got %s, want %s", tt.name, got, tt.want)
		}
	}
}

// FuzzAccessToken: whatever a client sends as its bearer token, Verify does not panic, and what
// it accepts is a token Issue signed: it names the subject issued, never one a client wrote.
func FuzzAccessToken(f *testing.F) {
	tokens, err := NewTokens(secret, time.Hour)
	if err != nil {
		f.Fatal(err)
	}
	want := Subject{Account: "acct-ana", Payer: "payer-ana", Person: "PF", Device: "the-phone"} // fixed: each fuzzing worker issues its own
	good, _ := tokens.Issue(want)
	for _, s := range []string{good, "", "a.b.c", good + "x", strings.ToUpper(good), "eyJhbGciOiJub25lIn0.e30.", strings.Repeat("A", maxTokenLen+1)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, token string) {
		s, err := tokens.Verify(token)
		if err == nil && (s.Account != want.Account || s.Payer != want.Payer || s.Person != want.Person || s.Device != want.Device) {
			t.Fatalf("Verify(%q) accepted subject %+v", token, s)
		}
	})
}

// FuzzIPExtractor: whatever a client writes in X-Forwarded-For, and whatever the peer's address,
// the extractor does not panic, names a real address (the peer's or a hop's), ignores the header
// of a peer that is not a trusted proxy, and, behind one that appended the client's address,
// names that address: nothing written left of it chooses another key.
func FuzzIPExtractor(f *testing.F) {
	for _, seed := range [][2]string{
		{"10.1.1.1:1234", "1.2.3.4, 198.51.100.1"}, {"10.1.1.1:1234", "not-an-ip, 10.3.3.3"},
		{"[::ffff:10.0.0.1]:1", "[2001:db8::1]:80,, ,"}, {"fe80::1%eth0", "10.0.0.1%x, ::ffff:1.2.3.4"},
		{"203.0.113.5:1234", "198.51.100.1"}, {"", ""},
	} {
		f.Add(seed[0], seed[1])
	}
	extract := IPExtractor([]netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8::/32")})
	f.Fuzz(func(t *testing.T, peer, xff string) {
		req := httptest.NewRequest("GET", "/", nil)
		req.RemoteAddr = peer
		req.Header.Set("X-Forwarded-For", xff)
		got := extract(req)
		from, ok := parseHop(peer)
		if !ok {
			return // no address to name: clientIP answers 400
		}
		if _, err := netip.ParseAddr(got); err != nil {
			t.Fatalf("peer %q, X-Forwarded-For %q: %q is no address", peer, xff, got)
		}
		if !netip.MustParsePrefix("10.0.0.0/8").Contains(from) && !netip.MustParsePrefix("2001:db8::/32").Contains(from) {
			if got != from.String() {
				t.Fatalf("untrusted peer %q, X-Forwarded-For %q: %q, want the peer", peer, xff, got)
			}
			return
		}
		named := got == from.String()
		for hop := range strings.SplitSeq(xff, ",") {
			if a, ok := parseHop(hop); ok && a.String() == got {
				named = true
			}
		}
		if !named {
			t.Fatalf("peer %q, X-Forwarded-For %q: %q is neither the peer nor a hop", peer, xff, got)
		}
		req.Header.Set("X-Forwarded-For", xff+", 198.51.100.7") // our proxy appends the client it saw
		if got := extract(req); got != "198.51.100.7" {
			t.Fatalf("X-Forwarded-For %q then the client our proxy saw: %q, want 198.51.100.7", xff, got)
		}
	})
}

type finder map[string]pix.Account

// TestPasswordLanesTakeTurns: with strangers and trusted devices waiting, the comparisons go to
// each lane in turn, a trusted device's first: a thief's flood in the trusted lane (a stolen
// device token) takes every other turn, not all.
func TestPasswordLanesTakeTurns(t *testing.T) {
	p, err := NewPasswords(bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	hash, _ := bcrypt.GenerateFromPassword([]byte("right"), bcrypt.MinCost)
	accounts := finder{"11144477735": {ID: "acct-ana", PasswordHash: hash}}
	cores := p.free
	for range cores {
		_ = p.take(t.Context(), Anyone)
	}
	p.wait = time.Minute
	done := make(chan string, 4)
	for i, who := range []struct {
		name string
		from From
	}{{"stranger 1", Anyone}, {"stranger 2", Anyone}, {"device 1", Trusted}, {"device 2", Trusted}} {
		go func() {
			if _, err := p.Check(t.Context(), accounts, "11144477735", "right", who.from); err != nil {
				t.Errorf("%s: %v", who.name, err)
			}
			done <- who.name
		}()
		for p.queued() != i+1 { // each in line before the next
			time.Sleep(time.Millisecond)
		}
	}
	p.give() // one comparison free: each check's end hands it on
	var order []string
	for range 4 {
		order = append(order, <-done)
	}
	if want := []string{"device 1", "stranger 1", "device 2", "stranger 2"}; !slices.Equal(order, want) {
		t.Errorf("compared in the order %v, want %v", order, want)
	}
	for range cores - 1 {
		p.give()
	}
}

// TestNoComparisonIsLost: a check whose client leaves, or whose wait ends, just as a comparison
// is handed to it neither keeps it idle nor loses it: it passes it to the check behind it, or,
// its wait over, takes it.
func TestNoComparisonIsLost(t *testing.T) {
	for _, tc := range []struct {
		name string
		wait time.Duration
		want error // the check that stops waiting: its answer
	}{{"its client left", time.Minute, context.Canceled}, {"its wait ended", 10 * time.Millisecond, nil}} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := NewPasswords(bcrypt.MinCost)
			if err != nil {
				t.Fatal(err)
			}
			cores := p.free
			for range cores { // every comparison running
				_ = p.take(t.Context(), Anyone)
			}
			p.wait = tc.wait
			ctx, leave := context.WithCancel(t.Context())
			defer leave()
			stopped, handed := make(chan struct{}), make(chan struct{})
			p.stopped = func() { close(stopped); <-handed } // only the first check stops waiting
			first := make(chan error, 1)
			go func() { first <- p.take(ctx, Anyone) }()
			for p.queued() != 1 {
				time.Sleep(time.Millisecond)
			}
			if tc.want != nil {
				leave()
			}
			<-stopped
			p.wait, p.stopped = time.Minute, nil
			behind := make(chan error, 1)
			go func() { behind <- p.take(t.Context(), Anyone) }() // in line behind it
			for p.queued() != 2 {
				time.Sleep(time.Millisecond)
			}
			p.give() // handed to the first, which has stopped waiting
			close(handed)
			if err := <-first; !errors.Is(err, tc.want) {
				t.Fatalf("the check that stopped waiting: %v, want %v", err, tc.want)
			}
			if tc.want == nil { // it took its turn, compared and ended
				p.give()
			}
			select {
			case err := <-behind:
				if err != nil {
					t.Fatalf("the check behind it: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the check behind it never had its turn: a comparison was lost")
			}
			for range cores { // the check behind it, and the rest, end
				p.give()
			}
			if p.queued() != 0 || p.free != cores {
				t.Errorf("%d free, %d waiting; want %d and none", p.free, p.queued(), cores)
			}
		})
	}
}

// TestPasswordsCompareOnePerCore: a replica compares at most one password per core at once.
// With every comparison running, a check waits its wait and is ErrBusy, or ends with its client;
// a comparison that ends goes to a check waiting, a trusted device's before a stranger's that
// came before it.
func TestPasswordsCompareOnePerCore(t *testing.T) {
	p, err := NewPasswords(bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := p.free, runtime.GOMAXPROCS(0); got != want {
		t.Fatalf("%d comparisons at once, want %d, one per core", got, want)
	}
	hash, _ := bcrypt.GenerateFromPassword([]byte("right"), bcrypt.MinCost)
	accounts := finder{"11144477735": {ID: "acct-ana", PasswordHash: hash}}
	cores := p.free
	for range cores { // every core comparing
		if err := p.take(t.Context(), Anyone); err != nil {
			t.Fatal(err)
		}
	}
	p.wait = 20 * time.Millisecond
	if _, err := p.Check(t.Context(), accounts, "11144477735", "right", Trusted); !errors.Is(err, ErrBusy) {
		t.Errorf("every comparison running: %v, want ErrBusy", err)
	}
	left, leave := context.WithCancel(t.Context())
	leave()
	if _, err := p.Check(left, accounts, "11144477735", "right", Anyone); !errors.Is(err, context.Canceled) {
		t.Errorf("a client that left: %v, want context.Canceled", err)
	}

	p.wait = time.Minute
	waiting := func(from From) int { p.mu.Lock(); defer p.mu.Unlock(); return len(p.waiting[from]) }
	done := make(chan string, 2) // in the order the checks ended
	check := func(name string, from From) {
		if _, err := p.Check(t.Context(), accounts, "11144477735", "right", from); err != nil {
			t.Errorf("%s: %v, want the account", name, err)
		}
		done <- name
	}
	go check("the stranger", Anyone)
	for waiting(Anyone) != 1 {
		time.Sleep(time.Millisecond)
	}
	go check("the trusted device", Trusted)
	for waiting(Trusted) != 1 {
		time.Sleep(time.Millisecond)
	}
	p.give() // one comparison ends: the device, which came second, goes first; its end lets the stranger in
	if first, second := <-done, <-done; first != "the trusted device" || second != "the stranger" {
		t.Errorf("%s compared first, then %s; want the trusted device first", first, second)
	}
	for range cores - 1 { // the rest end
		p.give()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.free != cores || len(p.waiting[Anyone])+len(p.waiting[Trusted]) != 0 {
		t.Errorf("%d free, %v waiting, want %d free (every check gave its own back) and none", p.free, p.waiting, cores)
	}
}

func (f finder) AccountByDocument(_ context.Context, doc string) (pix.Account, error) {
	a, ok := f[doc]
	if !ok {
		return pix.Account{}, pix.ErrAccountNotFound
	}
	return a, nil
}

func TestCheckPassword(t *testing.T) {
	accounts := finder{}
	demo, err := pix.DemoAccounts(bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	passwords, err := NewPasswords(bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range demo {
		accounts[a.Document] = a
	}
	ctx := context.Background()
	if a, err := passwords.Check(ctx, accounts, "52998224725", "demo-ana-123", Anyone); err != nil || a.ID != "acct-ana" {
		t.Fatalf("right password: %v, %v", a.ID, err)
	}
	for _, tt := range []struct{ doc, pw string }{
		{"52998224725", "wrong"},
		{"12345678909", "demo-ana-123"},
		{"12345678909", "pixlimit-dummy-password-never-matches"}, // the dummy hash's own password
	} {
		if _, err := passwords.Check(ctx, accounts, tt.doc, tt.pw, Anyone); !errors.Is(err, ErrInvalidCredentials) {
			t.Errorf("%s/%s: %v, want ErrInvalidCredentials", tt.doc, strings.Repeat("*", len(tt.pw)), err)
		}
	}
}

// TestTheDummyHashCostsWhatTheAccountsDo: an unknown document is compared against a hash of the
// accounts' own cost, at any cost, so it takes as long as a wrong password.
func TestTheDummyHashCostsWhatTheAccountsDo(t *testing.T) {
	for _, cost := range []int{bcrypt.MinCost, bcrypt.MinCost + 1} {
		p, err := NewPasswords(cost)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := bcrypt.Cost(p.dummy); err != nil || got != cost {
			t.Errorf("NewPasswords(%d): a dummy hash of cost %d (%v)", cost, got, err)
		}
	}
	if DefaultPasswordCost < 10 {
		t.Errorf("DefaultPasswordCost %d, want 10 or more: a real deployment's", DefaultPasswordCost)
	}
	if _, err := NewPasswords(bcrypt.MinCost - 1); err == nil {
		t.Error("a cost below bcrypt's least: want an error")
	}
}

// TestAMalformedHashTakesAComparisonsTime: an account whose stored hash is empty or no bcrypt
// hash refuses every password, and takes as long as a wrong password does, not microseconds: a
// login must not tell that its document is a customer's.
func TestAMalformedHashTakesAComparisonsTime(t *testing.T) {
	const cost = bcrypt.MinCost + 4 // about 10 ms a comparison: far above the noise of a call
	passwords, err := NewPasswords(cost)
	if err != nil {
		t.Fatal(err)
	}
	corrupt, err := bcrypt.GenerateFromPassword([]byte("anything"), cost)
	if err != nil {
		t.Fatal(err)
	}
	corrupt[10] = '!'                                                              // in its salt: no bcrypt base64, though of the right length and cost
	accounts := finder{"11144477735": {ID: "acct-carla", Document: "11144477735"}, // no hash
		"39053344705": {ID: "acct-bruno", Document: "39053344705", PasswordHash: []byte("$2a$not-a-hash")},
		"52998224725": {ID: "acct-ana", Document: "52998224725", PasswordHash: corrupt}}
	ctx := context.Background()
	took := func(doc string) time.Duration {
		var ds []time.Duration
		for range 5 {
			start := time.Now()
			if _, err := passwords.Check(ctx, accounts, doc, "anything", Anyone); !errors.Is(err, ErrInvalidCredentials) {
				t.Fatalf("%s: %v, want ErrInvalidCredentials", doc, err)
			}
			ds = append(ds, time.Since(start))
		}
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	unknown := took("12345678909")
	for _, doc := range []string{"11144477735", "39053344705", "52998224725"} {
		if got := took(doc); got < unknown/4 {
			t.Errorf("%s, a malformed hash: %v, an unknown document %v: it answers faster, and says it is a customer", doc, got, unknown)
		}
	}
}

// TestTokensAreShort: an access token is read before anyone is known, so one longer than
// maxTokenLen is refused unread, however well signed; the tokens Issue makes, with the longest
// names the ledger gives, are far shorter.
func TestTokensAreShort(t *testing.T) {
	tokens, err := NewTokens(secret, 15*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("x", 64)
	issued, err := tokens.Issue(Subject{Account: long, Payer: long, Person: "PJ", Device: long})
	if err != nil {
		t.Fatal(err)
	}
	if len(issued) > maxTokenLen/2 {
		t.Errorf("an issued token of %d bytes: want at most half of maxTokenLen (%d)", len(issued), maxTokenLen)
	}
	signed := func(payer int) string { // a token signed as Issue signs, its payer id payer bytes long
		c := claims{RegisteredClaims: jwt.RegisteredClaims{Subject: "acct-ana", ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Minute)),
			IssuedAt: jwt.NewNumericDate(time.Now())}, Payer: strings.Repeat("p", payer), Person: "PF"}
		s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString(tokens.secret)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	if fits := signed(maxTokenLen / 2); len(fits) > maxTokenLen {
		t.Fatalf("the control token is %d bytes, over the cap", len(fits))
	} else if _, err := tokens.Verify(fits); err != nil {
		t.Errorf("a well-signed token of %d bytes: %v, want it verified", len(fits), err)
	}
	huge := signed(maxTokenLen)
	if _, err := tokens.Verify(huge); !errors.Is(err, ErrUnauthorized) {
		t.Errorf("a well-signed token of %d bytes, over the cap: %v, want ErrUnauthorized", len(huge), err)
	}
}

// queued is how many checks wait for a comparison.
func (p *Passwords) queued() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.waiting[Anyone]) + len(p.waiting[Trusted])
}
