package pixlimit_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// A README sentence is a claim, and so is a link: these tests hold the docs to the code.

var (
	// mdLink is a Markdown link to a line of a file: [text](path#L<n>).
	mdLink = regexp.MustCompile(`\[([^\]]*)\]\(([^)#\s]+)#L(\d+)\)`)
	// anyLineLink is any Markdown link to a line, in whatever form (a range, a title).
	anyLineLink = regexp.MustCompile(`\[[^\]]*\]\([^)]*#L\d[^)]*\)`)
	// backQuoted is a back-quoted token of a link's text.
	backQuoted = regexp.MustCompile("`([^`]+)`")
	// identifier is a back-quoted token that names something in code (a file name does not).
	identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$`)
)

// docs are the Markdown files a reader follows: the README and docs/ (the history excepted: it
// records what was true then).
func docs(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	out := []string{"README.md"}
	for _, f := range files {
		if !strings.HasSuffix(f, "-history.md") {
			out = append(out, f)
		}
	}
	return out
}

// linkedName is the first back-quoted identifier of a link's text, its last part for a qualified
// one (`limiter.apply` is apply), or "" when the text names none. A token that is a file name
// (`sliding_log.lua`, `errors.go`) names the file, not a line.
func linkedName(text string) string {
	for _, m := range backQuoted.FindAllStringSubmatch(text, -1) {
		tok := m[1]
		if !identifier.MatchString(tok) || regexp.MustCompile(`\.(go|lua|md|ya?ml|json|sql|sh|js|html)$`).MatchString(tok) {
			continue
		}
		return tok[strings.LastIndex(tok, ".")+1:]
	}
	return ""
}

// span is where a Go declaration is: from its doc comment (or its first line) to its last line.
type span struct{ doc, name, end int }

// goDecls lists, by name, every declaration of a Go file: funcs and methods, types (their span
// reaching to the end of the methods that follow them), vars, consts and struct fields.
func goDecls(t *testing.T, path string) map[string][]span {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	line := func(p token.Pos) int { return fset.Position(p).Line }
	start := func(doc *ast.CommentGroup, at token.Pos) int {
		if doc != nil {
			return line(doc.Pos())
		}
		return line(at)
	}
	decls := map[string][]span{}
	add := func(name string, s span) { decls[name] = append(decls[name], s) }
	receiverEnd := map[string]int{} // a type's last method's end
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			add(d.Name.Name, span{start(d.Doc, d.Pos()), line(d.Name.Pos()), line(d.End())})
			if d.Recv != nil && len(d.Recv.List) == 1 {
				typ := d.Recv.List[0].Type
				if star, ok := typ.(*ast.StarExpr); ok {
					typ = star.X
				}
				if id, ok := typ.(*ast.Ident); ok {
					receiverEnd[id.Name] = max(receiverEnd[id.Name], line(d.End()))
				}
			}
		case *ast.GenDecl:
			for _, s := range d.Specs {
				doc := d.Doc
				switch s := s.(type) {
				case *ast.TypeSpec:
					if s.Doc != nil {
						doc = s.Doc
					}
					add(s.Name.Name, span{start(doc, d.Pos()), line(s.Name.Pos()), line(s.End())})
					if st, ok := s.Type.(*ast.StructType); ok {
						for _, fl := range st.Fields.List {
							for _, n := range fl.Names {
								add(n.Name, span{start(fl.Doc, fl.Pos()), line(n.Pos()), line(fl.End())})
							}
						}
					}
				case *ast.ValueSpec:
					if s.Doc != nil {
						doc = s.Doc
					}
					for _, n := range s.Names {
						add(n.Name, span{start(doc, s.Pos()), line(n.Pos()), line(s.End())})
					}
				}
			}
		}
	}
	for name, end := range receiverEnd {
		for i := range decls[name] {
			decls[name][i].end = max(decls[name][i].end, end)
		}
	}
	return decls
}

// TestDocsLinksLandOnWhatTheyName: every link of README.md and docs/ to a line (path#L<n>) names,
// back-quoted in its text, what is there, and lands on it, within 2 lines: in a Go file on its definition
// (func, type, var, const, field) or the start of the doc comment right above it; in another file
// on a line holding it.
func TestDocsLinksLandOnWhatTheyName(t *testing.T) {
	t.Parallel()
	checked := 0
	for _, doc := range docs(t) {
		src, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		if all, read := anyLineLink.FindAllString(string(src), -1), mdLink.FindAllString(string(src), -1); len(all) != len(read) {
			t.Errorf("%s: %d links to a line, %d of them in the form [text](path#L<n>), the one this test reads: %q", doc, len(all), len(read), all)
		}
		for _, m := range mdLink.FindAllStringSubmatch(string(src), -1) {
			if strings.HasPrefix(m[2], "http") {
				continue
			}
			name := linkedName(m[1])
			if name == "" { // a line number alone drifts as the file changes, and nothing could tell
				t.Errorf("%s: [%s](%s#L%s) names nothing on its line: name what it points at, back-quoted", doc, m[1], m[2], m[3])
				continue
			}
			path := filepath.Join(filepath.Dir(doc), m[2])
			n, _ := strconv.Atoi(m[3])
			if landsOn(t, path, name, n) {
				checked++
				continue
			}
			t.Errorf("%s: [%s](%s#L%s) does not land on `%s`", doc, m[1], m[2], m[3], name)
		}
	}
	if checked == 0 {
		t.Error("no link to a line of code was checked")
	}
}

// relLink is a Markdown link to a file of the repository or a heading, not to a line: its path
// (empty: this file) and its anchor (empty: none).
var relLink = regexp.MustCompile(`\]\(([^)#\s]*)(?:#([^)\s]+))?\)`)

// TestDocsLinksFindTheirTargets: every link of README.md and docs/ to a file of the repository
// finds it, and every link to a heading (#anchor, as GitHub makes them) finds the heading.
func TestDocsLinksFindTheirTargets(t *testing.T) {
	t.Parallel()
	checked := 0
	for _, doc := range append(docs(t), "docs/benchmarks-history.md") {
		src, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range relLink.FindAllStringSubmatch(string(src), -1) {
			path, anchor := m[1], m[2]
			if strings.Contains(path, "://") || strings.HasPrefix(path, "mailto:") || strings.HasPrefix(anchor, "L") && path != "" {
				continue // the web, and lines (TestDocsLinksLandOnWhatTheyName)
			}
			target := doc
			if path != "" {
				target = filepath.Join(filepath.Dir(doc), path)
			}
			if _, err := os.Stat(target); err != nil {
				t.Errorf("%s: link %q: no such file %s", doc, m[0], target)
				continue
			}
			if anchor != "" && !slices.Contains(headingAnchors(t, target), anchor) {
				t.Errorf("%s: link %q: %s has no heading #%s", doc, m[0], target, anchor)
				continue
			}
			checked++
		}
	}
	if checked == 0 {
		t.Error("no link was checked")
	}
}

// headingAnchors are the anchors GitHub gives the headings of a Markdown file: lower case, spaces
// as hyphens, punctuation but hyphens and underscores dropped, a repeated one numbered (-1, -2).
func headingAnchors(t *testing.T, path string) []string {
	t.Helper()
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var anchors []string
	seen := map[string]int{}
	fenced := false
	for _, l := range strings.Split(string(src), "\n") {
		if strings.HasPrefix(l, "```") {
			fenced = !fenced
		}
		if fenced || !strings.HasPrefix(l, "#") {
			continue
		}
		text := strings.TrimSpace(strings.TrimLeft(l, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(text) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			anchors = append(anchors, a+"-"+strconv.Itoa(n))
		} else {
			anchors = append(anchors, a)
		}
		seen[a]++
	}
	return anchors
}

// landsOn reports whether line n of path is, within 2 lines, where name is defined (Go) or
// written (any other file).
func landsOn(t *testing.T, path, name string, n int) bool {
	t.Helper()
	near := func(l int) bool { return l >= n-2 && l <= n+2 }
	if strings.HasSuffix(path, ".go") {
		for _, s := range goDecls(t, path)[name] {
			if near(s.doc) || near(s.name) {
				return true
			}
		}
		return false
	}
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	word := regexp.MustCompile(`\b` + regexp.QuoteMeta(name) + `\b`)
	for i, l := range strings.Split(string(src), "\n") {
		if near(i+1) && word.MatchString(l) {
			return true
		}
	}
	return false
}

// TestTheReadingTableCountsItsLines: each row of the README's "Read it in this order" gives the
// lines a reader reads, within 10%: a whole file; one declaration (a type with its methods);
// "`A` to `B`", from A's first line to B's last; "`A` and `B`", both; "(to `B`)" in its last
// column, the file from its top to B's last line.
func TestTheReadingTableCountsItsLines(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(src), "## Read it in this order")
	if !ok {
		t.Fatal("README.md has no section \"Read it in this order\"")
	}
	rows, sum := 0, 0
	byRow := map[int]int{} // each row's lines, by its number
	inTable := false
	for _, row := range strings.Split(table, "\n") {
		if inTable && !strings.HasPrefix(row, "|") {
			break // the table ended
		}
		inTable = strings.HasPrefix(row, "|")
		cells := strings.Split(row, "|")
		if len(cells) < 5 || !regexp.MustCompile(`^\s*\d+\s*$`).MatchString(cells[1]) {
			continue
		}
		rows++
		link := regexp.MustCompile(`\[([^\]]*)\]\(([^)#]+)`).FindStringSubmatch(cells[2])
		stated, err := strconv.Atoi(strings.TrimSpace(cells[3]))
		if link == nil || err != nil {
			t.Errorf("README reading table row %q: want a link and a line count", row)
			continue
		}
		got := readLines(t, link[2], link[1], cells[4])
		sum += got
		n, _ := strconv.Atoi(strings.TrimSpace(cells[1]))
		byRow[n] = got
		if math.Abs(float64(got-stated)) > 0.1*float64(got) {
			t.Errorf("README reading table: %s says %d lines, the code has %d", strings.TrimSpace(cells[2]), stated, got)
		}
	}
	if rows == 0 {
		t.Error("the reading table has no rows")
	}
	// The sentence above the table says how much it is in all.
	about := regexp.MustCompile(`About ([0-9,]+) lines, the table's`).FindStringSubmatch(table)
	if about == nil {
		t.Fatal("README's reading section does not say how many lines the table is: \"About N lines, the table's\"")
	}
	if stated, _ := strconv.Atoi(strings.ReplaceAll(about[1], ",", "")); math.Abs(float64(sum-stated)) > 0.1*float64(sum) {
		t.Errorf("README says about %d lines to read; the table's rows are %d", stated, sum)
	}
	// And how much of it answers a newcomer's first questions: "Rows 1, 2 and 5–9, about N lines".
	first := regexp.MustCompile(`Rows ([0-9, –and]+), about ([0-9,]+) lines`).FindStringSubmatch(table)
	if first == nil {
		t.Fatal("README's reading section does not say which rows answer the first questions: \"Rows 1, 2 and 5–9, about N lines\"")
	}
	part := 0
	for _, item := range regexp.MustCompile(`\d+(–\d+)?`).FindAllString(first[1], -1) {
		from, to, _ := strings.Cut(item, "–")
		lo, _ := strconv.Atoi(from)
		hi := lo
		if to != "" {
			hi, _ = strconv.Atoi(to)
		}
		for r := lo; r <= hi; r++ {
			if _, ok := byRow[r]; !ok {
				t.Errorf("README names row %d of the reading table, which has none", r)
			}
			part += byRow[r]
		}
	}
	if stated, _ := strconv.Atoi(strings.ReplaceAll(first[2], ",", "")); math.Abs(float64(part-stated)) > 0.1*float64(part) {
		t.Errorf("README says rows %s are about %d lines; they are %d", first[1], stated, part)
	}
}

// readLines counts what a row of the reading table asks to read (TestTheReadingTableCountsItsLines).
func readLines(t *testing.T, path, text, note string) int {
	t.Helper()
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	total := strings.Count(string(src), "\n")
	var names []string
	for _, m := range backQuoted.FindAllStringSubmatch(text, -1) {
		if n := linkedName("`" + m[1] + "`"); n != "" {
			names = append(names, n)
		}
	}
	until := regexp.MustCompile("\\(to `([A-Za-z_][A-Za-z0-9_]*)`\\)").FindStringSubmatch(note)
	if !strings.HasSuffix(path, ".go") || len(names) == 0 && until == nil {
		return total
	}
	decls := goDecls(t, path)
	one := func(name string) span {
		if len(decls[name]) == 0 {
			t.Fatalf("%s: no declaration of %s", path, name)
		}
		return decls[name][0]
	}
	switch {
	case until != nil:
		return one(until[1]).end
	case len(names) == 1:
		s := one(names[0])
		return s.end - s.doc + 1
	case strings.Contains(text, "` to `"):
		return one(names[len(names)-1]).end - one(names[0]).doc + 1
	}
	sum := 0
	for _, n := range names {
		s := one(n)
		sum += s.end - s.doc + 1
	}
	return sum
}

// TestCopyingTheLimiterTakesWhatTheREADMESays: README's "Copying the limiter" says internal/ratelimit
// is about so many lines of Go importing go-redis alone, and names what its tests bring; the
// package's own files are counted and their imports read (the standard library's have no dot in
// their first element).
func TestCopyingTheLimiterTakesWhatTheREADMESays(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("Copy `internal/ratelimit`: its Go \\(about ([0-9,]+)\\s+lines, importing go-redis alone\\)").FindSubmatch(readme)
	if m == nil {
		t.Fatal("README's Copying the limiter no longer says how many lines the core is: say it, or drop this test")
	}
	said, _ := strconv.Atoi(strings.ReplaceAll(string(m[1]), ",", ""))
	files, err := filepath.Glob("internal/ratelimit/*.go")
	if err != nil {
		t.Fatal(err)
	}
	// What its tests bring along is named in the same paragraph: each package of the module, and
	// each module other than go-redis, by its last element.
	_, copying, _ := strings.Cut(string(readme), "**Copying the limiter.**")
	copying, _, _ = strings.Cut(copying, "\n\n")
	lines := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			parsed, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range parsed.Imports {
				path, _ := strconv.Unquote(imp.Path.Value)
				first, _, _ := strings.Cut(path, "/")
				if !strings.Contains(first, ".") || path == "github.com/redis/go-redis/v9" || path == "github.com/pixlimit/pixlimit/internal/ratelimit" {
					continue
				}
				name := path[strings.LastIndex(path, "/")+1:]
				if regexp.MustCompile(`^v\d+$`).MatchString(name) { // a module's major version: name it by the element before
					trimmed := path[:strings.LastIndex(path, "/")]
					name = trimmed[strings.LastIndex(trimmed, "/")+1:]
				}
				if !strings.Contains(copying, "`"+name+"`") && !strings.Contains(copying, "/"+name+"`") {
					t.Errorf("%s imports %s, which README's Copying the limiter does not name among what the tests bring", f, path)
				}
			}
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		lines += strings.Count(string(src), "\n")
		parsed, err := parser.ParseFile(token.NewFileSet(), f, src, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range parsed.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if first, _, _ := strings.Cut(path, "/"); strings.Contains(first, ".") && path != "github.com/redis/go-redis/v9" {
				t.Errorf("%s imports %s: README says the core imports go-redis alone", f, path)
			}
		}
	}
	if math.Abs(float64(lines-said)) > 0.1*float64(said) {
		t.Errorf("README says about %d lines of Go in internal/ratelimit; it has %d", said, lines)
	}
	// The example that copies it: its lines, as said.
	m = regexp.MustCompile("`internal/ratelimit` alone \\(([0-9]+) lines").FindSubmatch(readme)
	example, err := os.ReadFile("examples/echo/main.go")
	if err != nil {
		t.Fatal(err)
	}
	if m == nil || string(m[1]) != strconv.Itoa(strings.Count(string(example), "\n")) {
		t.Errorf("README's example of copying the limiter: %q, want its %d lines", m, strings.Count(string(example), "\n"))
	}
}

// TestNoFunctionIsLongerThan80Lines: a function a reader follows fits on a screen or two (issue
// 47), the demo's stories included. Tests are left out: a table test is long by its table.
func TestNoFunctionIsLongerThan80Lines(t *testing.T) {
	const most = 80
	fset := token.NewFileSet()
	read := 0
	err := filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		read++
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok {
				if n := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1; n > most {
					t.Errorf("%s: %s is %d lines, more than %d", fset.Position(fd.Pos()), fd.Name.Name, n, most)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if read < 50 {
		t.Fatalf("read %d Go files: the walk missed the tree", read)
	}
}

// TestTheLayoutIsDrawnAsItIs: the README's layout lists every import among the program's packages
// (internal/testing and examples left out), no more, each line's arrows pointing to packages
// listed below it or importing nothing of ours.
func TestTheLayoutIsDrawnAsItIs(t *testing.T) {
	t.Parallel()
	const module = "github.com/pixlimit/pixlimit"
	src, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, layout, _ := strings.Cut(string(src), "## Layout")
	_, block, _ := strings.Cut(layout, "```\n")
	block, _, _ = strings.Cut(block, "```")
	path := func(name string) string {
		switch {
		case name == ".":
			return module
		case strings.HasPrefix(name, "cmd/"), strings.HasPrefix(name, "deploy/"), name == "client":
			return module + "/" + name
		}
		return module + "/internal/" + name
	}
	expand := func(field string) []string { // ratelimit/{a,b} is ratelimit/a and ratelimit/b
		head, rest, ok := strings.Cut(field, "{")
		if !ok {
			return []string{field}
		}
		var out []string
		for _, v := range strings.Split(strings.TrimSuffix(rest, "}"), ",") {
			out = append(out, head+v)
		}
		return out
	}
	drawn, line := map[string]map[string]bool{}, map[string]int{}
	for i, l := range strings.Split(block, "\n") {
		from, to, ok := strings.Cut(l, "─→")
		if !ok {
			continue
		}
		to, _, _ = strings.Cut(to, "(") // a remark
		for _, f := range expand(strings.TrimSpace(from)) {
			if _, twice := drawn[path(f)]; twice {
				t.Errorf("%s drawn on two lines: one line a package", f)
			}
			line[path(f)], drawn[path(f)] = i, map[string]bool{}
			for _, field := range strings.Fields(to) {
				for _, name := range expand(field) {
					drawn[path(f)][path(name)] = true
				}
			}
		}
	}
	if len(drawn) < 10 {
		t.Fatalf("read %d packages from the README's layout, want its every line", len(drawn))
	}
	actual := map[string]map[string]bool{}
	fset := token.NewFileSet()
	err = filepath.WalkDir(".", func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() && (p == "internal/testing" || p == "examples") {
			if err == nil {
				err = filepath.SkipDir
			}
			return err
		}
		if d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		pkg := path(".")
		if dir := filepath.ToSlash(filepath.Dir(p)); dir != "." {
			pkg = module + "/" + dir
		}
		for _, imp := range f.Imports {
			if to, _ := strconv.Unquote(imp.Path.Value); to == module || strings.HasPrefix(to, module+"/") {
				if actual[pkg] == nil {
					actual[pkg] = map[string]bool{}
				}
				actual[pkg][to] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for pkg, imports := range actual {
		for to := range imports {
			if !drawn[pkg][to] {
				t.Errorf("%s imports %s: not drawn", pkg, to)
			}
		}
	}
	for pkg, imports := range drawn {
		for to := range imports {
			if !actual[pkg][to] {
				t.Errorf("%s ─→ %s drawn: no such import", pkg, to)
			}
			if at, listed := line[to]; listed && at <= line[pkg] {
				t.Errorf("%s ─→ %s points up the list", pkg, to)
			}
		}
	}
}

// TestEveryFuzzTargetIsListed: the README names every fuzz target of the repository.
func TestEveryFuzzTargetIsListed(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, readme, _ := strings.Cut(string(src), "Fuzz targets:")
	readme, _, _ = strings.Cut(readme, "e.g.")
	found := 0
	for name, at := range testFuncs(t) {
		if strings.HasPrefix(name, "Fuzz") {
			found++
			if !strings.Contains(readme, "`"+name+"`") {
				t.Errorf("%s: %s is not among the README's fuzz targets", at, name)
			}
		}
	}
	if found == 0 {
		t.Error("no fuzz target found")
	}
}

// TestEveryTestTheDocsNameExists: a test, benchmark, fuzz target or example that README.md or
// docs/ names in back quotes, as the proof of a claim or the command of a figure, is one the
// repository has: renamed or removed, the claim has lost its proof.
func TestEveryTestTheDocsNameExists(t *testing.T) {
	t.Parallel()
	defined := testFuncs(t)
	named := regexp.MustCompile("`((?:Test|Benchmark|Fuzz|Example)[A-Z][A-Za-z0-9_]*)")
	checked := 0
	for _, doc := range docs(t) {
		src, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for n, line := range strings.Split(string(src), "\n") {
			for _, m := range named.FindAllStringSubmatch(line, -1) {
				checked++
				if _, ok := defined[m[1]]; !ok {
					t.Errorf("%s:%d names %s, which no _test.go file defines", doc, n+1, m[1])
				}
			}
		}
	}
	if checked == 0 {
		t.Error("the docs name no test")
	}
}

// testFuncs are the repository's top-level functions of its _test.go files, each with where it
// is defined.
func testFuncs(t *testing.T) map[string]string {
	t.Helper()
	fset, funcs := token.NewFileSet(), map[string]string{}
	err := filepath.WalkDir(".", func(p string, d os.DirEntry, err error) error {
		if err != nil || !strings.HasSuffix(p, "_test.go") {
			return err
		}
		f, err := parser.ParseFile(fset, p, nil, 0)
		if err != nil {
			return err
		}
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil {
				funcs[fd.Name.Name] = fset.Position(fd.Pos()).String()
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return funcs
}
