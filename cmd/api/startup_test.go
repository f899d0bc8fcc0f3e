package main

import (
	"context"
	"crypto/rand"
	"flag"
	"net/url"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pixlimit/pixlimit/internal/testing/pgtest"
	"github.com/pixlimit/pixlimit/internal/testing/redistest"
)

// TestMain lets a test run this package's main as a process of its own (the test binary, with
// PIXLIMIT_RUN_MAIN=1), to see its exit status and what it prints. Most of this package's tests
// wait on servers (a lease, a queue's turns, a failover, a restart) more than on the CPU: four
// run at once, not GOMAXPROCS's two, unless -parallel says how many.
func TestMain(m *testing.M) {
	if os.Getenv("PIXLIMIT_RUN_MAIN") == "1" {
		os.Args = []string{"api"}
		main()
		os.Exit(0)
	}
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		_ = flag.Set("test.parallel", strconv.Itoa(max(4, runtime.GOMAXPROCS(0))))
	}
	os.Exit(m.Run())
}

// TestStartupFailuresSayWhyAndExit1: a ledger that cannot be opened after Redis is connected
// (nothing listens at DATABASE_URL; a role that may not create the schema) stops the program
// with exit status 1 and the cause on stderr; never a panic, never a silent exit.
func TestStartupFailuresSayWhyAndExit1(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	for _, tt := range []struct {
		name, databaseURL string
		cause             []string // each printed
	}{
		{"nothing listens", "postgres://postgres@127.0.0.1:1/pixlimit?sslmode=disable", []string{"DATABASE_URL", "connect"}},
		{"the migration may not write", readOnlyRole(t), []string{"DATABASE_URL", "migrat", "permission denied"}},
	} {
		ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "PIXLIMIT_RUN_MAIN=1", "HTTP_ADDR=127.0.0.1:0", "METRICS_ADDR=",
			"REDIS_URL=redis://"+srv.Addr(), "AUTH_SECRET="+testSecret, "DATABASE_URL="+tt.databaseURL)
		out, err := cmd.CombinedOutput()
		cancel()
		exit, _ := err.(*exec.ExitError)
		if exit == nil || exit.ExitCode() != 1 {
			t.Errorf("%s: %v, want exit status 1\n%s", tt.name, err, out)
			continue
		}
		for _, want := range tt.cause {
			if !strings.Contains(string(out), want) {
				t.Errorf("%s: the output does not say %q:\n%s", tt.name, want, out)
			}
		}
		if strings.Contains(string(out), "panic") || strings.Contains(string(out), "goroutine ") {
			t.Errorf("%s: the program panicked:\n%s", tt.name, out)
		}
	}
}

// readOnlyRole returns the URL of a fresh database as a role that may connect but not create
// tables in it (PostgreSQL 15 grants no CREATE on schema public to other roles).
func readOnlyRole(t *testing.T) string {
	t.Helper()
	dbURL := pgtest.URL(t)
	conn := pgtest.Connect(t, dbURL)
	role := "pixlimit_reader_" + strings.ToLower(rand.Text()[:10])
	for _, sql := range []string{
		"CREATE ROLE " + role + " LOGIN PASSWORD 'reader-" + role + "'",
		"REVOKE CREATE ON SCHEMA public FROM PUBLIC",
	} {
		if _, err := conn.Exec(t.Context(), sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	t.Cleanup(func() { // before pgtest drops the database: the role owns nothing in it
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if c, err := pgx.Connect(ctx, dbURL); err == nil {
			_, _ = c.Exec(ctx, "DROP ROLE IF EXISTS "+role)
			c.Close(ctx)
		}
	})
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(role, "reader-"+role)
	return u.String()
}

// TestPublishedDemoPasswordsAreAWarning: a replica on a shared Redis with no DATABASE_URL seeds
// the demo accounts by default (the contract's), and their passwords are published: it says so
// as loudly as it does for PostgreSQL, not at INFO.
func TestPublishedDemoPasswordsAreAWarning(t *testing.T) {
	t.Parallel()
	a := startAPI(t, redistest.Start(t), map[string]string{})
	if logs := a.logs.String(); !strings.Contains(logs, `level=WARN msg="seeding the demo accounts, whose passwords are published, into the in-memory ledger`) {
		t.Errorf("the demo accounts seeded into memory without a warning:\n%s", logs)
	}
}
