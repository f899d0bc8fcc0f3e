package pgtest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// Server is a PostgreSQL server of one test's own, in a fresh data directory on a free port: a
// test that must stop, restart or reconfigure the server (a restart under load, say) never
// touches the shared one. Its one database, postgres, trusts the postgres user on loopback.
type Server struct {
	// URL is the server's postgres database, as the postgres user.
	URL string

	t   testing.TB
	bin string // the directory of initdb, pg_ctl, postgres
	dir string // the data directory
	as  *syscall.Credential
}

// StartServer initializes and starts a server for t, and stops it and removes its files when t
// ends. It needs PostgreSQL's server programs (Debian: apt-get install postgresql); as root, it
// runs them as the postgres user, since PostgreSQL refuses to run as root.
func StartServer(t testing.TB) *Server {
	t.Helper()
	return start(t, 0)
}

// StartOnSmallDisk is StartServer with the server's files (its data, its WAL and its log) on a
// file system of their own, a tmpfs of diskBytes, that FillDisk fills and FreeDisk frees: a test
// of a database whose disk is full. Mounting it needs root (CAP_SYS_ADMIN); without, the test is
// skipped, and says so.
func StartOnSmallDisk(t testing.TB, diskBytes int) *Server {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("pgtest: a disk of the server's own is a tmpfs mount, which needs root")
	}
	return start(t, diskBytes)
}

// start starts a server, on a tmpfs of diskBytes when that is not 0.
func start(t testing.TB, diskBytes int) *Server {
	t.Helper()
	bin, err := serverBin()
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	s := &Server{t: t, bin: bin}
	dir, err := os.MkdirTemp("", "pixlimit-pg-")
	if err != nil {
		t.Fatal(err)
	}
	s.dir = dir
	t.Cleanup(func() { os.RemoveAll(dir) })
	if diskBytes > 0 {
		// A test killed before its cleanups (a -timeout panic) leaves its mount, empty of a
		// server, until the machine restarts: at most diskBytes of memory.
		if err := mountDisk(dir, diskBytes); errors.Is(err, errors.ErrUnsupported) || errors.Is(err, syscall.EPERM) {
			t.Skipf("pgtest: mounting a disk of the server's own needs Linux and CAP_SYS_ADMIN: %v", err)
		} else if err != nil {
			t.Fatalf("pgtest: mount a tmpfs of %d bytes: %v", diskBytes, err)
		}
		t.Cleanup(func() { // after the server's stop, registered below
			if err := unmountDisk(dir); err != nil {
				t.Errorf("pgtest: unmount the server's disk %s: %v", dir, err)
			}
		})
	}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("pgtest: running as root, and no postgres user to run the server as: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		s.as = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	port := freePort(t)
	s.run("initdb", "-D", filepath.Join(dir, "data"), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
	// fsync off: the test's server need not survive a crash of the machine, only restarts.
	opts := fmt.Sprintf("-p %d -c listen_addresses=127.0.0.1 -k %s -c fsync=off -c full_page_writes=off", port, dir)
	s.run("pg_ctl", "-D", filepath.Join(dir, "data"), "-l", filepath.Join(dir, "log"), "-o", opts, "-w", "-t", "60", "start")
	t.Cleanup(func() { s.ctl("-m", "immediate", "stop") })
	s.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	return s
}

// FillDisk fills the server's disk (StartOnSmallDisk) with a file of its own until no byte more
// fits: what the server has written keeps its place, and whatever must grow a file fails.
func (s *Server) FillDisk() {
	s.t.Helper()
	f, err := os.Create(filepath.Join(s.dir, "ballast"))
	if err != nil {
		s.t.Fatalf("pgtest: %v", err)
	}
	defer f.Close()
	chunk := make([]byte, 1<<20)
	for err == nil {
		_, err = f.Write(chunk)
	}
	for len(chunk) > 1 && errors.Is(err, syscall.ENOSPC) { // the last pages, smaller writes
		chunk = chunk[:len(chunk)/2]
		for err = nil; err == nil; {
			_, err = f.Write(chunk)
		}
	}
	if !errors.Is(err, syscall.ENOSPC) {
		s.t.Fatalf("pgtest: fill the disk: %v, want no space left", err)
	}
}

// FreeDisk removes what FillDisk wrote.
func (s *Server) FreeDisk() {
	s.t.Helper()
	if err := os.Remove(filepath.Join(s.dir, "ballast")); err != nil {
		s.t.Fatalf("pgtest: %v", err)
	}
}

// Restart stops the server as an operator's restart does (fast shutdown: every session is
// terminated, transactions in flight roll back) and starts it again, waiting until it accepts
// connections.
func (s *Server) Restart() {
	s.t.Helper()
	s.ctl("-m", "fast", "-w", "-t", "60", "restart")
}

// Crash stops the server as a crash does (immediate shutdown: every process quits at once, no
// checkpoint, connections cut mid-answer) and starts it again, which recovers from its WAL.
func (s *Server) Crash() {
	s.t.Helper()
	s.ctl("-m", "immediate", "-w", "-t", "60", "restart")
}

func (s *Server) ctl(args ...string) {
	s.t.Helper()
	s.run("pg_ctl", append([]string{"-D", filepath.Join(s.dir, "data"), "-l", filepath.Join(s.dir, "log")}, args...)...)
}

func (s *Server) run(prog string, args ...string) {
	s.t.Helper()
	cmd := exec.Command(filepath.Join(s.bin, prog), args...)
	cmd.Dir = s.dir
	if s.as != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.as}
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		log, _ := os.ReadFile(filepath.Join(s.dir, "log"))
		s.t.Fatalf("pgtest: %s %s: %v\n%s\n%s", prog, strings.Join(args, " "), err, out, log)
	}
}

// serverBin finds the directory of PostgreSQL's server programs: pg_config's, else the newest
// of Debian's /usr/lib/postgresql/*/bin.
func serverBin() (string, error) {
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		dir := strings.TrimSpace(string(out))
		if _, err := os.Stat(filepath.Join(dir, "initdb")); err == nil {
			return dir, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return versionOf(dirs[i]) < versionOf(dirs[j]) })
	for i := len(dirs) - 1; i >= 0; i-- {
		if _, err := os.Stat(filepath.Join(dirs[i], "initdb")); err == nil {
			return dirs[i], nil
		}
	}
	return "", fmt.Errorf("no PostgreSQL server programs (initdb, pg_ctl): install them (Debian: apt-get install postgresql)")
}

func versionOf(bin string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(bin)))
	return n
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
