package main

import (
	"bufio"
	"crypto/rand"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pixlimit/pixlimit/internal/testing/apitest"
)

// TestEveryListenerHasItsDeadlines: the public API, the desk and the metrics are each served by
// httpServer, whose every wait has a deadline. The metrics' server had none for an idle
// connection: 155 left idle held their file descriptors until the public API's accept failed.
func TestEveryListenerHasItsDeadlines(t *testing.T) {
	srv := httpServer(http.NotFoundHandler(), time.Second, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if srv.ReadHeaderTimeout <= 0 || srv.ReadTimeout <= 0 || srv.WriteTimeout != time.Second || srv.IdleTimeout <= 0 || srv.MaxHeaderBytes != 12<<10 {
		t.Errorf("httpServer: header %v, read %v, write %v, idle %v, header bytes %d: want every one set, 12 KiB of headers (16 with net/http's 4 on top)",
			srv.ReadHeaderTimeout, srv.ReadTimeout, srv.WriteTimeout, srv.IdleTimeout, srv.MaxHeaderBytes)
	}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Name.Name == "httpServer" || fn.Name.Name == "listen" {
				continue
			}
			ast.Inspect(fn, func(n ast.Node) bool {
				if lit, ok := n.(*ast.CompositeLit); ok {
					if sel, ok := lit.Type.(*ast.SelectorExpr); ok && sel.Sel.Name == "Server" {
						t.Errorf("%s: %s builds an http.Server of its own: use httpServer", fset.Position(lit.Pos()), fn.Name.Name)
					}
				}
				if sel, ok := n.(*ast.SelectorExpr); ok && sel.Sel.Name == "Listen" {
					if pkg, ok := sel.X.(*ast.Ident); ok && pkg.Name == "net" {
						t.Errorf("%s: %s listens on its own: use listen, which bounds its connections", fset.Position(sel.Pos()), fn.Name.Name)
					}
				}
				return true
			})
		}
	}
}

// TestAListenerHoldsAtMostItsConnections: a listener of at most 2, with two clients keeping their
// connections open, closes a third at once (its client learns it now, and goes elsewhere), and
// serves another once one of the two has left.
func TestAListenerHoldsAtMostItsConnections(t *testing.T) {
	t.Parallel()
	addr := serveOn(t, 2)
	first, second := dial(t, addr), dial(t, addr)
	for i, c := range []net.Conn{first, second} {
		if got, err := ask(c, "x"); got != "HTTP/1.1 200 OK" {
			t.Fatalf("client %d: %q %v, want 200", i+1, got, err)
		}
	}
	if got, err := ask(dial(t, addr), "x"); err == nil {
		t.Fatalf("a third connection beside two open: %q, want it closed unanswered", got)
	}
	first.Close()
	var got string
	for deadline := time.Now().Add(10 * time.Second); got != "HTTP/1.1 200 OK" && time.Now().Before(deadline); {
		c := dial(t, addr)
		got, _ = ask(c, "x") // once the server has seen the first leave
		c.Close()
	}
	if got != "HTTP/1.1 200 OK" {
		t.Fatalf("a connection once one of the two left: %q, want 200", got)
	}
}

// TestTheDeskAndTheMetricsHold64ConnectionsEach: the program's side listeners, each with 64
// connections open, close a 65th at once, unanswered: a few operators and scrapers, never the
// public listener's thousands; and 16 of one address, so one client holding its connections idle
// does not lock the others out.
func TestTheDeskAndTheMetricsHold64ConnectionsEach(t *testing.T) {
	t.Parallel()
	env := map[string]string{"METRICS_ADDR": apitest.FreeAddr(t), "ADMIN_ADDR": apitest.FreeAddr(t), "ADMIN_TOKEN": rand.Text() + rand.Text()}
	startAPI(t, nil, env)
	for _, side := range []string{"METRICS_ADDR", "ADMIN_ADDR"} {
		addr := env[side]
		for i := range 64 { // the figures api.md gives: 16 from each of 4 addresses
			from := fmt.Sprintf("127.0.0.%d", 1+i/16)
			if got, err := ask(dialFrom(t, from, addr), "x"); !strings.HasPrefix(got, "HTTP/1.1 ") {
				t.Fatalf("%s, connection %d from %s: %q %v, want an answer", side, i+1, from, got, err)
			}
			if i%16 == 15 { // that address's 16 open: its 17th is closed, another address's is not
				if got, err := ask(dialFrom(t, from, addr), "x"); err == nil {
					t.Errorf("%s, a 17th connection from %s: %q, want it closed unanswered", side, from, got)
				}
			}
		}
		if got, err := ask(dialFrom(t, "127.0.0.5", addr), "x"); err == nil {
			t.Errorf("%s, a connection beside 64 open: %q, want it closed unanswered", side, got)
		}
	}
}

// dialFrom dials addr from the local address from (a loopback address: 127.0.0.0/8 is all one's).
func dialFrom(t *testing.T, from, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	c, err := d.Dial("tcp", addr)
	if errors.Is(err, syscall.EADDRNOTAVAIL) {
		t.Skipf("no loopback address %s here (Linux has 127.0.0.0/8; macOS 127.0.0.1 alone)", from)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestThePublicBoundLeavesTheReplicaItsFiles: HTTP_MAX_CONNECTIONS past the descriptors the
// process may open is cut to what leaves the replica its own (ownFiles: Redis's and the
// database's connections, the desk and the metrics), or half of a limit too small for that.
func TestThePublicBoundLeavesTheReplicaItsFiles(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		want      int
		openFiles uint64
		got       int
	}{
		{10_000, 1 << 20, 10_000},
		{10_000, 10_000 + ownFiles, 10_000},
		{10_000, 10_000 + ownFiles - 1, 10_000 - 1},
		{10_000, 4096, 4096 - ownFiles},
		{10_000, 1024, 512},
		{100, 1024, 100},
		{10_000, 1, 1},
		{10_000, 0, 1},
	} {
		if got := publicConnections(tc.want, tc.openFiles); got != tc.got {
			t.Errorf("publicConnections(%d, %d) = %d, want %d", tc.want, tc.openFiles, got, tc.got)
		}
	}
}

// TestRequestHeadersAre16KiBAtMost: 15 KiB of a request's headers are read, 17 KiB are 431.
func TestRequestHeadersAre16KiBAtMost(t *testing.T) {
	t.Parallel()
	addr := serveOn(t, 10)
	for _, tc := range []struct {
		kib  int
		want string
	}{{15, "HTTP/1.1 200 OK"}, {17, "HTTP/1.1 431 Request Header Fields Too Large"}} {
		if got, err := ask(dial(t, addr), strings.Repeat("x", tc.kib<<10)); got != tc.want {
			t.Errorf("%d KiB of headers: %q %v, want %q", tc.kib, got, err, tc.want)
		}
	}
}

// serveOn serves an empty 200 on a listener of listen's, holding at most most connections, and
// returns its address.
func serveOn(t *testing.T, most int) string {
	t.Helper()
	ln, err := listen("127.0.0.1:0", most, 0)
	if err != nil {
		t.Fatal(err)
	}
	srv := httpServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}), time.Second, slog.New(slog.DiscardHandler))
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String()
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// ask sends a GET on c with an X-Big header and returns its answer's status line.
func ask(c net.Conn, header string) (string, error) {
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\nX-Big: %s\r\n\r\n", header); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

// remoteAt is a connection from addr, as peerOf reads one.
type remoteAt struct {
	net.Conn
	addr net.Addr
}

func (c remoteAt) RemoteAddr() net.Addr { return c.addr }

// TestAPeerIsAnAddressOrA64: the side listeners' bound per peer counts an IPv6 client by its /64,
// whose addresses it picks at will, and an IPv4 one by its address, mapped or through NAT64 too.
func TestAPeerIsAnAddressOrA64(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ in, want string }{
		{"198.51.100.7", "198.51.100.7"},
		{"::ffff:198.51.100.7", "198.51.100.7"},
		{"64:ff9b::c633:6407", "198.51.100.7"},
		{"2001:db8:1:2::1", "2001:db8:1:2::"},
		{"2001:db8:1:2:aaaa:bbbb:cccc:dddd", "2001:db8:1:2::"},
	} {
		c := remoteAt{addr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr(tt.in), 1234))}
		if got := peerOf(c).String(); got != tt.want {
			t.Errorf("peerOf(%s) = %s, want %s", tt.in, got, tt.want)
		}
	}
}
