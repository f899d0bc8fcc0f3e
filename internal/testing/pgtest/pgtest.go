// Package pgtest gives each test a PostgreSQL database of its own on a real server, dropped when
// the test ends.
//
// The server is, in order: the one DATABASE_URL names, the one the libpq PG* variables describe
// (PGHOST set), the local server on 127.0.0.1:5432 as user postgres (trust authentication, as on
// Debian's development machines) when it answers, and otherwise a container of the
// testcontainers-go Postgres module when Docker is available. Failing all four, the test fails
// and says what to install.
package pgtest

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
)

var (
	once     sync.Once
	adminURL string
	findErr  error
)

// URL creates a fresh database for t and returns its URL.
func URL(t testing.TB) string {
	t.Helper()
	once.Do(func() { adminURL, findErr = findServer() })
	if findErr != nil {
		t.Fatalf("pgtest: %v", findErr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		t.Fatalf("pgtest: connect %s: %v", redact(adminURL), err)
	}
	defer admin.Close(context.Background())
	name := fmt.Sprintf("pixlimit_test_%d_%d", os.Getpid(), time.Now().UnixNano())
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("pgtest: create database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, adminURL)
		if err != nil {
			t.Logf("pgtest: drop %s: %v", name, err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Logf("pgtest: drop %s: %v", name, err)
		}
	})
	u, err := url.Parse(adminURL)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	u.Path = "/" + name
	return u.String()
}

func findServer() (string, error) {
	if u := os.Getenv("DATABASE_URL"); u != "" {
		return u, nil
	}
	if os.Getenv("PGHOST") != "" {
		return pgEnvURL(), nil
	}
	const local = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	if c, err := net.DialTimeout("tcp", "127.0.0.1:5432", time.Second); err == nil {
		c.Close()
		return local, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := tcpostgres.Run(ctx, "postgres:15-alpine",
		tcpostgres.WithUsername("postgres"), tcpostgres.WithPassword("postgres"), tcpostgres.BasicWaitStrategies())
	if err != nil {
		return "", fmt.Errorf("no PostgreSQL: DATABASE_URL and PGHOST are unset, nothing listens on 127.0.0.1:5432, "+
			"and Docker is not usable (%v); install PostgreSQL (Debian: apt-get install postgresql) or start Docker", err)
	}
	// The container lives as long as the test binary; Ryuk reaps it afterwards.
	return c.ConnectionString(ctx, "sslmode=disable")
}

// pgEnvURL builds a URL from PGHOST, PGPORT, PGUSER and PGPASSWORD.
func pgEnvURL() string {
	u := url.URL{Scheme: "postgres", Host: os.Getenv("PGHOST"), Path: "/postgres", RawQuery: "sslmode=disable"}
	if p := os.Getenv("PGPORT"); p != "" {
		u.Host = net.JoinHostPort(u.Host, p)
	}
	user := os.Getenv("PGUSER")
	if user == "" {
		user = "postgres"
	}
	if pw := os.Getenv("PGPASSWORD"); pw != "" {
		u.User = url.UserPassword(user, pw)
	} else {
		u.User = url.User(user)
	}
	return u.String()
}

func redact(s string) string {
	if u, err := url.Parse(s); err == nil {
		return u.Redacted()
	}
	return strings.SplitN(s, "@", 2)[0]
}

// Gate is a TCP proxy in front of a database that a test can freeze, as SIGSTOP freezes a
// server: while closed, connections are accepted and bytes are read, but nothing is forwarded
// either way, so clients wait on a server that neither answers nor hangs up. It can also hold
// COMMITs (HoldCommits): it reads the PostgreSQL protocol from the clients, message by message,
// and keeps a COMMIT from the server until the test releases or drops it, so a test can make a
// COMMIT's answer arrive after its client gave up, and decide whether it committed.
type Gate struct {
	// URL is the database's URL through the gate (sslmode=disable: the gate reads the protocol).
	URL string

	mu     sync.Mutex
	closed bool
	cut    bool
	live   map[net.Conn]bool // client sides, for Cut
	open   *sync.Cond
	// stranded are the client sides Strand or Blackhole left dead, until Release or the test's
	// end (ending); blackhole strands every new connection too.
	stranded  map[net.Conn]bool
	blackhole bool
	ending    bool

	trips atomic.Int64 // round trips the clients began (RoundTrips)

	holding bool // COMMITs wait at the gate
	held    int  // COMMITs waiting now
	epoch   int  // incremented by each ReleaseCommits, DropCommits or StrandCommits
	dropped bool // what the last of them decided
	// lost: the COMMITs held before this epoch are never sent, their connections left open
	// (StrandCommits), until the test ends.
	lost int
}

// NewGate starts a gate in front of the database of url, open, and stops it when t ends.
func NewGate(t testing.TB, dbURL string) *Gate {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	upstream := u.Host
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	g := &Gate{live: map[net.Conn]bool{}, stranded: map[net.Conn]bool{}}
	g.open = sync.NewCond(&g.mu)
	u.Host = ln.Addr().String()
	q := u.Query()
	q.Set("sslmode", "disable")
	u.RawQuery = q.Encode()
	g.URL = u.String()
	var conns sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		g.mu.Lock()
		g.ending = true
		g.mu.Unlock()
		g.Open()
		g.DropCommits()
		// The clients close their connections in their own cleanups, which ran before this one;
		// one left open (a leak, a replica that did not stop) is closed after a while, so the test
		// ends, and said.
		done := make(chan struct{})
		go func() { conns.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Errorf("pgtest: connections through the gate still open 30s after the test ended: closing them")
			g.mu.Lock()
			for c := range g.live {
				c.Close()
			}
			g.mu.Unlock()
			<-done
		}
	})
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			g.mu.Lock()
			cut := g.cut
			if !cut {
				g.live[client] = true
				if g.blackhole {
					g.stranded[client] = true
				}
			}
			g.mu.Unlock()
			if cut {
				client.Close()
				continue
			}
			server, err := net.Dial("tcp", upstream)
			if err != nil {
				client.Close()
				continue
			}
			conns.Add(2)
			go func() { defer conns.Done(); g.fromClient(server, client) }()
			go func() { defer conns.Done(); g.pipe(client, server) }()
		}
	}()
	return g
}

// Cut breaks every connection through the gate and refuses new ones until Open, as a database
// that went away (or a network that lost it) would.
func (g *Gate) Cut() {
	g.mu.Lock()
	g.cut = true
	for c := range g.live {
		c.Close()
	}
	g.mu.Unlock()
}

// Strand leaves every connection open now dead, as a network that lost its route and came back
// leaves them: their bytes go nowhere and nothing hangs up, so a client learns only by waiting
// out its timeout on each; new connections pass. They stay dead past Open, until Release.
func (g *Gate) Strand() { g.strand(func() {}) }

// Unreachable is a database whose route is gone, as a client sees it once its kernel knows: the
// connections open now are stranded (see Strand) and new ones fail at once, until Open.
func (g *Gate) Unreachable() { g.strand(func() { g.cut = true }) }

// Blackhole is a network cut as a firewall that drops packets makes it: every connection open
// now and every new one until Open is stranded (see Strand); a new one is accepted, and its
// client waits on a start-up that never answers, as on a SYN that is never answered.
func (g *Gate) Blackhole() { g.strand(func() { g.blackhole = true }) }

// strand strands every connection open now and, under the same lock, sets what happens to new
// ones.
func (g *Gate) strand(andNew func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	andNew()
	for c := range g.live {
		g.stranded[c] = true
	}
}

// Release lets the stranded connections' bytes through again (for a test's cleanup, before its
// clients close them: a client closing a stranded connection can wait on it).
func (g *Gate) Release() {
	g.mu.Lock()
	clear(g.stranded)
	g.mu.Unlock()
	g.open.Broadcast()
}

// Close freezes the gate: nothing more is forwarded until Open.
func (g *Gate) Close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
}

// Open lets bytes through again, those held included (not those stranded: see Release), and
// accepts connections again.
func (g *Gate) Open() {
	g.mu.Lock()
	g.closed, g.cut, g.blackhole = false, false, false
	g.mu.Unlock()
	g.open.Broadcast()
}

// HoldCommits makes every COMMIT a client sends from now on wait at the gate, unsent, until
// ReleaseCommits or DropCommits. The transaction keeps its locks meanwhile, as one whose COMMIT
// is slow in the server does.
func (g *Gate) HoldCommits() {
	g.mu.Lock()
	g.holding = true
	g.mu.Unlock()
}

// Held is the number of COMMITs waiting at the gate.
func (g *Gate) Held() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.held
}

// ReleaseCommits sends the held COMMITs on to the server, which commits them, whether or not
// their clients still wait, and stops holding.
func (g *Gate) ReleaseCommits() { g.endHold(false) }

// DropCommits ends the connections of the held COMMITs without sending them: the server rolls
// their transactions back. It stops holding.
func (g *Gate) DropCommits() { g.endHold(true) }

// StrandCommits loses the held COMMITs, as a network path that went dead does: they are never
// sent, and their connections stay open, so the server keeps their transactions open until it
// ends them itself. COMMITs sent from now on pass.
func (g *Gate) StrandCommits() {
	g.mu.Lock()
	g.holding = false
	g.epoch++
	g.lost = g.epoch
	g.mu.Unlock()
	g.open.Broadcast()
}

func (g *Gate) endHold(drop bool) {
	g.mu.Lock()
	g.holding, g.dropped = false, drop
	g.epoch++
	g.mu.Unlock()
	g.open.Broadcast()
}

// RoundTrips is how many round trips the gate's clients began: each simple query, and each Sync
// (the end of an extended-protocol exchange, however many statements a pipeline put before it).
func (g *Gate) RoundTrips() int64 { return g.trips.Load() }

// passCommit waits while a COMMIT is held and reports whether to send it.
func (g *Gate) passCommit() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.holding {
		return true
	}
	g.held++
	for epoch := g.epoch; g.epoch == epoch || epoch < g.lost && !g.ending; {
		g.open.Wait()
	}
	g.held--
	return !g.dropped && !g.ending
}

// fromClient copies a client's messages to the server, one PostgreSQL message at a time: the
// untyped start-up messages first, then typed ones (a byte, a length that counts itself, the
// body). A COMMIT (a simple query "commit") may be held (HoldCommits).
func (g *Gate) fromClient(server, client net.Conn) {
	defer g.closeBoth(server, client)
	r := bufio.NewReader(client)
	for startup := true; ; {
		var head []byte
		if !startup {
			t, err := r.ReadByte()
			if err != nil {
				return
			}
			head = []byte{t}
		}
		length := make([]byte, 4)
		if _, err := io.ReadFull(r, length); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint32(length)) - 4
		if n < 0 || n > 1<<28 {
			return
		}
		body := make([]byte, n)
		if _, err := io.ReadFull(r, body); err != nil {
			return
		}
		msg := append(append(head, length...), body...)
		if startup {
			// An SSLRequest or GSSENCRequest (refused: sslmode=disable) comes before the
			// StartupMessage; anything else is the StartupMessage itself.
			startup = n == 4 && (binary.BigEndian.Uint32(body) == 80877103 || binary.BigEndian.Uint32(body) == 80877104)
		} else if head[0] == 'Q' && strings.EqualFold(strings.Trim(string(body), "\x00; "), "commit") && !g.passCommit() {
			return
		}
		if len(head) > 0 && (head[0] == 'S' || head[0] == 'Q') {
			g.trips.Add(1) // a Sync ends what a client sends before it waits; a simple query is one alone
		}
		g.waitOpen(client)
		if _, err := server.Write(msg); err != nil {
			return
		}
	}
}

// waitOpen waits while the gate is closed, or client's connection is stranded.
func (g *Gate) waitOpen(client net.Conn) {
	g.mu.Lock()
	for (g.closed || g.stranded[client]) && !g.ending {
		g.open.Wait()
	}
	g.mu.Unlock()
}

func (g *Gate) closeBoth(a, b net.Conn) {
	a.Close()
	b.Close()
	g.mu.Lock()
	delete(g.live, a)
	delete(g.live, b)
	delete(g.stranded, a)
	delete(g.stranded, b)
	g.mu.Unlock()
	g.open.Broadcast() // a waiter on a stranded connection sees it closed
}

// pipe copies src to dst, the server's bytes to client, waiting at each chunk while the gate is
// closed or the connection stranded, and closes both ends when either side ends.
func (g *Gate) pipe(dst, src net.Conn) {
	defer g.closeBoth(dst, src)
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		g.waitOpen(dst)
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// Connect opens a connection to the database of url for t, closed when t ends.
func Connect(t testing.TB, url string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("pgtest: connect %s: %v", redact(url), err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}
