package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"log/slog"
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
	if srv.ReadHeaderTimeout <= 0 || srv.ReadTimeout <= 0 || srv.WriteTimeout != time.Second || srv.IdleTimeout <= 0 {
		t.Errorf("httpServer: header %v, read %v, write %v, idle %v: want every one set", srv.ReadHeaderTimeout, srv.ReadTimeout, srv.WriteTimeout, srv.IdleTimeout)
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
			if !ok || fn.Name.Name == "httpServer" {
				continue
			}
			ast.Inspect(fn, func(n ast.Node) bool {
				if lit, ok := n.(*ast.CompositeLit); ok {
					if sel, ok := lit.Type.(*ast.SelectorExpr); ok && sel.Sel.Name == "Server" {
						t.Errorf("%s: %s builds an http.Server of its own: use httpServer", fset.Position(lit.Pos()), fn.Name.Name)
					}
				}
				return true
			})
		}
	}
}
