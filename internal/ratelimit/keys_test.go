package ratelimit

import (
	"net/netip"
	"regexp"
	"strings"
	"testing"
)

var keyPattern = regexp.MustCompile(`^rl:[a-z0-9_-]{1,32}(:[a-z_]+)?:\{[A-Za-z0-9_-]{22}\}$`)

func TestKeyShape(t *testing.T) {
	k := newKeyer("rl", testSecret)
	got := k.key(Policy{Name: "login-account"}, "52998224725")
	if !keyPattern.MatchString(got) {
		t.Errorf("key %q does not match %v", got, keyPattern)
	}
	if strings.Contains(got, "52998224725") {
		t.Errorf("key %q holds the CPF in clear", got)
	}
	if fw := k.key(Policy{Name: "login-account", Algorithm: FixedWindow}, "52998224725"); !keyPattern.MatchString(fw) || fw == got {
		t.Errorf("fixed_window key %q: want its own key of the same shape", fw)
	}
	if other := newKeyer("rl", []byte("another secret, another fleet...")).key(Policy{Name: "login-account"}, "52998224725"); other == got {
		t.Error("two secrets give the same key: the hash is not keyed")
	}
}

func FuzzKey(f *testing.F) {
	f.Add("pix", "acct-1", "acct-2")
	f.Add("login-ip", "2001:db8::1", "")
	f.Fuzz(func(t *testing.T, policy, a, b string) {
		if (Policy{Name: policy, Limit: 1, Window: 1e9}).Validate() != nil {
			t.Skip()
		}
		k := newKeyer("rl", testSecret)
		p := Policy{Name: policy}
		ka, kb := k.key(p, a), k.key(p, b)
		if !keyPattern.MatchString(ka) {
			t.Fatalf("key %q does not match %v", ka, keyPattern)
		}
		if ka != k.key(p, a) {
			t.Fatal("key is not deterministic")
		}
		if (a == b) != (ka == kb) {
			t.Fatalf("identities %q, %q → keys %q, %q", a, b, ka, kb)
		}
		if len(a) >= 8 && strings.Contains(ka, a) {
			t.Fatalf("key %q holds the identity %q in clear", ka, a)
		}
	})
}

func TestIPIdentity(t *testing.T) {
	tests := []struct{ in, want string }{
		{"198.51.100.7", "198.51.100.7"},
		{"::ffff:198.51.100.7", "198.51.100.7"},
		{"2001:db8:1:2:aaaa:bbbb:cccc:dddd", "2001:db8:1:2::/64"},
		{"2001:db8:1:2::1", "2001:db8:1:2::/64"},
		{"fe80::1%eth0", "fe80::/64"},
		// IPv4 clients of an IPv6-only site, through NAT64: each its own, not one /64 for all.
		{"64:ff9b::c633:6407", "198.51.100.7"},
		{"64:ff9b::cb00:7101", "203.0.113.1"},
		{"64:ff9b:0:0:1::1", "64:ff9b::/64"}, // outside the /96: an IPv6 address as any
	}
	for _, tt := range tests {
		if got := IPIdentity(netip.MustParseAddr(tt.in)); got != tt.want {
			t.Errorf("IPIdentity(%s) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func FuzzIPIdentity(f *testing.F) {
	f.Add([]byte("0123456789abcdef"), []byte("0123456789abcdeg"))
	f.Fuzz(func(t *testing.T, a, b []byte) {
		if len(a) != 16 || len(b) != 16 {
			t.Skip()
		}
		x, y := netip.AddrFrom16([16]byte(a)), netip.AddrFrom16([16]byte(b))
		if x.Is4In6() || y.Is4In6() || nat64.Contains(x) || nat64.Contains(y) {
			t.Skip()
		}
		samePrefix := string(a[:8]) == string(b[:8])
		if got := IPIdentity(x) == IPIdentity(y); got != samePrefix {
			t.Fatalf("%v, %v: same identity = %v, same /64 = %v", x, y, got, samePrefix)
		}
	})
}
