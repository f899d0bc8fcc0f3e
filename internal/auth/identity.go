package auth

import (
	"net"
	"net/netip"

	"github.com/labstack/echo/v4"
)

// IPExtractor returns how Echo finds the client address (c.RealIP) given the trusted proxies.
//
// With no trusted proxies the client is the TCP peer and X-Forwarded-For is ignored: anyone can
// write that header, so believing it would let a client pick its own rate-limit key. With
// trusted proxies, a request from one of them is attributed to the right-most X-Forwarded-For
// address that is not itself a trusted proxy: proxies append the address they received the
// request from, so everything right of the first untrusted hop was written by our own proxies,
// and everything left of it by the client. A request from any other peer is attributed to the
// peer, whatever its header says.
//
// Echo's extractor trusts loopback, link-local and private addresses by default; here only the
// configured ranges are trusted.
func IPExtractor(trusted []netip.Prefix) echo.IPExtractor {
	if len(trusted) == 0 {
		return echo.ExtractIPDirect()
	}
	opts := []echo.TrustOption{echo.TrustLoopback(false), echo.TrustLinkLocal(false), echo.TrustPrivateNet(false)}
	for _, p := range trusted {
		opts = append(opts, echo.TrustIPRange(prefixNet(p)))
	}
	return echo.ExtractIPFromXFFHeader(opts...)
}

func prefixNet(p netip.Prefix) *net.IPNet {
	p = p.Masked()
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
