package pixlimit_test

import (
	"bufio"
	"crypto/sha1"
	"encoding/hex"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pixlimit/pixlimit/internal/pix"
	"github.com/pixlimit/pixlimit/internal/testing/apitest"
	"github.com/pixlimit/pixlimit/internal/testing/redistest"
)

// TestRedisRunsOnlyTheRepositorysScripts watches a real redis-server with MONITOR from before a
// replica starts (its warm-up loads the scripts) while the replica serves a login, a look-up, two
// admitted PIX and a refused one, and a statement: every script it sent (the bodies of SCRIPT
// LOAD and EVAL, and the SHA-1 of every EVALSHA) is a .lua file of the repository, byte for byte.
func TestRedisRunsOnlyTheRepositorysScripts(t *testing.T) {
	t.Parallel()
	files := map[string]string{} // by SHA-1: the repository's .lua files
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() && d.Name() == ".git" {
			return filepath.SkipDir
		}
		if strings.HasSuffix(path, ".lua") {
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			sum := sha1.Sum(b)
			files[hex.EncodeToString(sum[:])] = path
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	srv := redistest.Start(t)
	mon, err := net.DialTimeout("tcp", srv.Addr(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mon.Close() })
	lines := bufio.NewReader(mon)
	if _, err := mon.Write([]byte("MONITOR\r\n")); err != nil {
		t.Fatal(err)
	}
	if ok, err := lines.ReadString('\n'); err != nil || ok != "+OK\r\n" {
		t.Fatalf("MONITOR: %q, %v", ok, err)
	}

	ledger, err := pix.NewMemoryLedger(apitest.DemoAccounts(t))
	if err != nil {
		t.Fatal(err)
	}
	replicas, _ := fleet(t, srv, ledger, 1, map[string]string{"REDIS_TIMEOUT": "1s", "PIX_LIMIT": "2"})
	a := replicas[0]
	ana := a.Token(apitest.Demo[0].Document, apitest.Demo[0].Password)
	if r := a.Do(http.MethodGet, "/v1/pix/keys/bruno@example.com", nil, "Authorization", "Bearer "+ana); r.Status != http.StatusOK {
		t.Fatalf("a look-up: %v", r)
	}
	var pixes []int
	for range 3 {
		pixes = append(pixes, a.PIX(ana, "bruno@example.com", 100).Status)
	}
	if pixes[0] != 201 || pixes[1] != 201 || pixes[2] != 429 {
		t.Fatalf("3 PIX at PIX_LIMIT 2: %v, want 201, 201, 429", pixes)
	}
	if r := a.Statement(ana); r.Status != http.StatusOK {
		t.Fatalf("a statement: %v", r)
	}
	const end = "pixlimit-monitor-end"
	if err := srv.Client(nil).Echo(t.Context(), end).Err(); err != nil {
		t.Fatal(err)
	}

	sent := map[string]string{} // by SHA-1: what the replica sent, and how
	_ = mon.SetReadDeadline(time.Now().Add(30 * time.Second))
	for {
		line, err := lines.ReadString('\n')
		if err != nil {
			t.Fatalf("reading MONITOR before the end marker: %v", err)
		}
		args := monitorArgs(t, line)
		if len(args) == 0 {
			continue
		}
		if strings.EqualFold(args[0], "echo") && len(args) > 1 && args[1] == end {
			break
		}
		switch cmd := strings.ToLower(args[0]); {
		case cmd == "evalsha" && len(args) > 1:
			sent[args[1]] = "EVALSHA"
		case cmd == "eval" && len(args) > 1:
			sum := sha1.Sum([]byte(args[1]))
			sent[hex.EncodeToString(sum[:])] = "EVAL " + firstLine(args[1])
		case cmd == "script" && len(args) > 2 && strings.EqualFold(args[1], "load"):
			sum := sha1.Sum([]byte(args[2]))
			sent[hex.EncodeToString(sum[:])] = "SCRIPT LOAD " + firstLine(args[2])
		case cmd == "fcall" || cmd == "function":
			t.Errorf("the replica used Redis Functions: %s", line)
		}
	}
	if len(sent) < 5 {
		t.Fatalf("MONITOR saw %d scripts, want the warm-up's and the requests'", len(sent))
	}
	for sha, how := range sent {
		if _, ok := files[sha]; !ok {
			t.Errorf("%s (SHA-1 %s) is no .lua file of the repository", how, sha)
		}
	}
	t.Logf("%d distinct scripts sent, each a file of the repository", len(sent))
}

// firstLine is a script's first line, to name it.
func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return strconv.Quote(line)
}

// monitorArgs parses a MONITOR line, `+<time> [<db> <client>] "arg" "arg" ...`, each argument
// escaped as Redis's sdscatrepr escapes it.
func monitorArgs(t *testing.T, line string) []string {
	t.Helper()
	_, rest, ok := strings.Cut(strings.TrimRight(line, "\r\n"), "] ")
	if !ok {
		return nil
	}
	var args []string
	for len(rest) > 0 {
		if rest[0] == ' ' {
			rest = rest[1:]
			continue
		}
		if rest[0] != '"' {
			t.Fatalf("MONITOR line %q: want quoted arguments", line)
		}
		var b strings.Builder
		i := 1
		for ; i < len(rest) && rest[i] != '"'; i++ {
			if rest[i] != '\\' {
				b.WriteByte(rest[i])
				continue
			}
			i++
			switch c := rest[i]; c {
			case 'n':
				b.WriteByte('\n')
			case 'r':
				b.WriteByte('\r')
			case 't':
				b.WriteByte('\t')
			case 'a':
				b.WriteByte('\a')
			case 'b':
				b.WriteByte('\b')
			case 'x':
				v, err := strconv.ParseUint(rest[i+1:i+3], 16, 8)
				if err != nil {
					t.Fatalf("MONITOR line %q: %v", line, err)
				}
				b.WriteByte(byte(v))
				i += 2
			default: // \\ and \"
				b.WriteByte(c)
			}
		}
		args = append(args, b.String())
		rest = rest[min(i+1, len(rest)):]
	}
	return args
}
