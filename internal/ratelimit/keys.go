package ratelimit

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"hash"
	"net/netip"
	"strings"
	"sync"
)

// keyer turns (policy, identity) into a Redis key:
//
//	prefix:policy:{hash}             with the default algorithm, sliding_log
//	prefix:policy:algorithm:{hash}   with any other
//
// Each algorithm keeps its own kind of value (a sorted set, a counter string), so switching a
// policy's algorithm starts fresh keys instead of reading another algorithm's state.
//
// hash is HMAC-SHA256(secret, identity) truncated to 128 bits and base64url-encoded. Keyed, so
// that no CPF, account or IP is readable in Redis, and a leaked dump cannot be reversed by hashing
// the possible CPFs (about 10^9); truncated, because 128 bits leave collisions out of reach and
// keep the key short. The braces make the hash a Redis Cluster hash tag, so every key of one
// identity lives in one slot.
type keyer struct {
	prefix string
	macs   sync.Pool // of *mac; hmac.New allocates more than the hashing costs
}

func newKeyer(prefix string, secret []byte) *keyer {
	secret = append([]byte(nil), secret...)
	return &keyer{
		prefix: prefix,
		macs:   sync.Pool{New: func() any { return &mac{h: hmac.New(sha256.New, secret)} }},
	}
}

// mac is a pooled HMAC and the buffer it hashes an identity from.
type mac struct {
	h   hash.Hash
	buf []byte
}

const hashLen = 16 // bytes of the HMAC kept in the key

func (k *keyer) key(p Policy, identity string) string {
	policy := p.Name
	if a := p.algorithm(); a != SlidingLog {
		policy += ":" + a.keyTag()
	}
	m := k.macs.Get().(*mac)
	m.h.Reset()
	m.buf = append(m.buf[:0], identity...) // []byte(identity) would allocate: Write's argument escapes
	m.h.Write(m.buf)
	var sum [sha256.Size]byte
	m.h.Sum(sum[:0])
	k.macs.Put(m)

	enc := base64.RawURLEncoding
	var b strings.Builder // one allocation: the key itself
	b.Grow(len(k.prefix) + len(policy) + 4 + enc.EncodedLen(hashLen))
	b.WriteString(k.prefix)
	b.WriteByte(':')
	b.WriteString(policy)
	b.WriteString(":{")
	var hash [22]byte // enc.EncodedLen(hashLen)
	enc.Encode(hash[:], sum[:hashLen])
	b.Write(hash[:])
	b.WriteByte('}')
	return b.String()
}

// IPIdentity is the identity of a client address for a Check. An IPv4 address (also one carried
// in IPv6: Unmap) stands for itself. An IPv6 address stands for its /64: one subscriber usually
// holds a whole /64 and can pick any address in it at will, so limiting single IPv6 addresses
// would limit nothing.
func IPIdentity(addr netip.Addr) string {
	addr = Unmap(addr)
	if addr.Is4() {
		return addr.String()
	}
	p, _ := addr.WithZone("").Prefix(64)
	return p.String()
}

// nat64 is NAT64's well-known prefix (RFC 6052): an IPv6-only site sees every IPv4 client in it,
// its address in the last 32 bits.
var nat64 = netip.MustParsePrefix("64:ff9b::/96")

// Unmap is the IPv4 address addr carries, if it carries one: mapped into IPv6 (::ffff:0:0/96), or
// translated by NAT64 (64:ff9b::/96), where every IPv4 client of an IPv6-only deployment would
// otherwise share one /64 and one key; else addr, without its zone.
func Unmap(addr netip.Addr) netip.Addr {
	addr = addr.WithZone("").Unmap()
	if nat64.Contains(addr) {
		b := addr.As16()
		return netip.AddrFrom4([4]byte(b[12:]))
	}
	return addr
}
