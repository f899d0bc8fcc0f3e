package main

import (
	"bufio"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestEveryListenerHasItsDeadlines: the public API, the desk and the metrics are each served by
// httpServer, whose every wait has a deadline. The metrics' server had none for an idle
// connection: 155 left idle held their file descriptors until the public API's accept failed.
func TestEveryListenerHasItsDeadlines(t *testing.T) {
	srv := httpServer(http.NotFoundHandler(), time.Second, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if srv.ReadHeaderTimeout <= 0 || srv.ReadTimeout <= 0 || srv.WriteTimeout != time.Second || srv.IdleTimeout <= 0 || srv.MaxHeaderBytes != 16<<10 {
		t.Errorf("httpServer: header %v, read %v, write %v, idle %v, header bytes %d: want every one set, 16 KiB of headers",
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

// TestAListenerHoldsAtMostItsConnections: a listener of at most 2 serves two clients that keep
// their connections open, and a third only once one of them leaves; a request's headers over
// 16 KiB are 431, not read on.
func TestAListenerHoldsAtMostItsConnections(t *testing.T) {
	t.Parallel()
	ln, err := listen("127.0.0.1:0", 2)
	if err != nil {
		t.Fatal(err)
	}
	srv := httpServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}), time.Second, slog.New(slog.DiscardHandler))
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	ask := func(c net.Conn, wait time.Duration, header string) (string, error) {
		_ = c.SetDeadline(time.Now().Add(wait))
		if _, err := fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\nX-Big: %s\r\n\r\n", header); err != nil {
			return "", err
		}
		line, err := bufio.NewReader(c).ReadString('\n')
		return strings.TrimSpace(line), err
	}
	var conns []net.Conn
	for i := range 3 {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
		if i < 2 {
			if got, err := ask(c, 10*time.Second, "x"); got != "HTTP/1.1 200 OK" {
				t.Fatalf("client %d: %q %v, want 200", i+1, got, err)
			}
		}
	}
	if got, err := ask(conns[2], 300*time.Millisecond, "x"); err == nil {
		t.Fatalf("a third connection beside two open: %q, want no answer while they stay", got)
	}
	conns[0].Close()
	if got, err := (func() (string, error) {
		_ = conns[2].SetDeadline(time.Now().Add(10 * time.Second))
		line, err := bufio.NewReader(conns[2]).ReadString('\n')
		return strings.TrimSpace(line), err
	})(); got != "HTTP/1.1 200 OK" {
		t.Fatalf("the third, once one left: %q %v, want 200", got, err)
	}
	if got, _ := ask(conns[1], 10*time.Second, strings.Repeat("x", 24<<10)); got != "HTTP/1.1 431 Request Header Fields Too Large" {
		t.Errorf("24 KiB of headers: %q, want 431", got)
	}
}
