package auth

import (
	"net"
	"net/http"
	"net/netip"
	"strings"

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
// Two cases never reach further left than our proxies wrote. When every hop is trusted, the
// client is the right-most address, the one our peer appended: further left, the client may have
// written anything (Echo's own extractor takes the left-most, which lets a client on a trusted
// network choose its key). A hop that is not an address (a client's garbage, left of what our
// proxies appended) ends the walk at the hop right of it.
func IPExtractor(trusted []netip.Prefix) echo.IPExtractor {
	if len(trusted) == 0 {
		return echo.ExtractIPDirect()
	}
	isTrusted := func(a netip.Addr) bool {
		a = a.Unmap()
		for _, p := range trusted {
			if p.Contains(a) {
				return true
			}
		}
		return false
	}
	return func(r *http.Request) string {
		peer, ok := parseHop(r.RemoteAddr)
		if !ok {
			return echo.ExtractIPDirect()(r)
		}
		hops := strings.Split(strings.Join(r.Header.Values(echo.HeaderXForwardedFor), ","), ",")
		if !isTrusted(peer) || len(r.Header.Values(echo.HeaderXForwardedFor)) == 0 {
			return peer.String()
		}
		client := peer
		for i := len(hops) - 1; i >= 0; i-- {
			a, ok := parseHop(hops[i])
			if !ok {
				return client.String()
			}
			if !isTrusted(a) {
				return a.String()
			}
			if i == len(hops)-1 {
				client = a // every hop trusted so far: the one our peer appended
			}
		}
		return client.String()
	}
}

// parseHop reads one address of X-Forwarded-For or RemoteAddr: a bare address, one in brackets,
// or either with a port.
func parseHop(s string) (netip.Addr, bool) {
	s = strings.TrimSpace(s)
	if a, err := netip.ParseAddr(strings.Trim(s, "[]")); err == nil {
		return a.WithZone("").Unmap(), true
	}
	host, _, err := net.SplitHostPort(s)
	if err != nil {
		return netip.Addr{}, false
	}
	a, err := netip.ParseAddr(host)
	return a.WithZone("").Unmap(), err == nil
}
