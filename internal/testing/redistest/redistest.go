// Package redistest gives tests a real Redis of their own.
//
// Start runs a private redis-server on a free loopback port in a temporary directory, so a test
// can kill, pause and restart it to play an outage without touching any shared server. Where
// redis-server is not installed but Docker is, it runs the testcontainers-go Redis module instead
// (outage controls then skip the test, since a restarted container changes its port). Where
// neither exists, the test fails and says what to install. There is deliberately no mock: the
// limiter's correctness lives in a Lua script that only a real Redis can run.
package redistest

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	tcredis "github.com/testcontainers/testcontainers-go/modules/redis"
)

// Server is one Redis server owned by one test.
type Server struct {
	t    testing.TB
	addr string

	// Local redis-server only; nil for a container.
	mu   sync.Mutex
	bin  string
	dir  string
	args []string // beyond the defaults: cluster, replication or sentinel settings
	// conf, when set, is written to dir/redis.conf and given to redis-server first: a sentinel
	// needs a configuration file it can rewrite.
	conf string
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// Start starts a Redis server for t and stops it when t ends.
func Start(t testing.TB) *Server {
	t.Helper()
	if bin, err := exec.LookPath("redis-server"); err == nil {
		s := &Server{t: t, bin: bin, dir: t.TempDir()}
		s.startLocal()
		t.Cleanup(s.stopLocal)
		return s
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := tcredis.Run(ctx, "redis:7.4-alpine")
	if err != nil {
		t.Fatalf("redistest: no redis-server on PATH and no usable Docker (%v): "+
			"install Redis 7 (Debian: apt-get install redis-server) or start Docker", err)
	}
	t.Cleanup(func() { _ = c.Terminate(context.Background()) })
	url, err := c.ConnectionString(ctx)
	if err != nil {
		t.Fatalf("redistest: container address: %v", err)
	}
	opt, err := redis.ParseURL(url)
	if err != nil {
		t.Fatalf("redistest: container address %q: %v", url, err)
	}
	return &Server{t: t, addr: opt.Addr}
}

// Addr is the server's host:port.
func (s *Server) Addr() string { return s.addr }

// Client returns a new client of the server with the options a rate limiter should use
// (see ratelimit.ClientOptions), closed when the test ends. Each call is a separate connection
// pool, a stand-in for a separate API replica.
func (s *Server) Client(tune func(*redis.Options)) *redis.Client {
	s.t.Helper()
	opt := &redis.Options{Addr: s.addr}
	if tune != nil {
		tune(opt)
	}
	c := redis.NewClient(opt)
	s.t.Cleanup(func() { _ = c.Close() })
	return c
}

// Kill stops the server abruptly (SIGKILL): connections are refused until Restart.
func (s *Server) Kill() {
	s.t.Helper()
	s.local("Kill")
	s.stopLocal()
}

// Restart starts a killed server again on the same port, empty.
func (s *Server) Restart() {
	s.t.Helper()
	s.local("Restart")
	s.startLocal()
}

// Pause freezes the server (SIGSTOP): connections open but nothing answers, the hardest
// outage for a client, since only its own deadline ends the wait. Resume undoes it.
func (s *Server) Pause() {
	s.t.Helper()
	s.local("Pause")
	s.signal(syscall.SIGSTOP)
}

// Resume thaws a paused server.
func (s *Server) Resume() {
	s.t.Helper()
	s.local("Resume")
	s.signal(syscall.SIGCONT)
}

func (s *Server) local(op string) {
	s.t.Helper()
	if s.bin == "" {
		s.t.Skipf("redistest: %s needs a local redis-server; this run uses a container", op)
	}
}

func (s *Server) signal(sig syscall.Signal) {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		s.t.Fatalf("redistest: server is not running")
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.t.Fatalf("redistest: signal %v: %v", sig, err)
	}
}

// startLocal starts redis-server and waits until it answers PING: on a free port the first time
// (trying another if one is taken meanwhile), on the same port after a Kill, since clients hold it.
func (s *Server) startLocal() {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	restart := s.addr != ""
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		if !restart {
			port, err := freePort()
			if err != nil {
				s.t.Fatalf("redistest: free port: %v", err)
			}
			s.addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		}
		_, port, _ := net.SplitHostPort(s.addr)
		var args []string
		if s.conf != "" {
			conf := filepath.Join(s.dir, "redis.conf")
			if err := os.WriteFile(conf, []byte(s.conf), 0o600); err != nil {
				s.t.Fatalf("redistest: %v", err)
			}
			args = append(args, conf)
		}
		args = append(args, "--bind", "127.0.0.1", "--port", port,
			"--save", "", "--appendonly", "no",
			"--dir", s.dir, "--logfile", filepath.Join(s.dir, "redis.log"))
		cmd := exec.Command(s.bin, append(args, s.args...)...)
		if err := cmd.Start(); err != nil {
			s.t.Fatalf("redistest: start redis-server: %v", err)
		}
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		if lastErr = waitReady(s.addr, done); lastErr == nil {
			s.cmd, s.done = cmd, done
			return
		}
		_ = cmd.Process.Kill()
		<-done
		time.Sleep(100 * time.Millisecond)
	}
	log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
	s.t.Fatalf("redistest: redis-server did not start on %s: %v\n%s", s.addr, lastErr, log)
}

func (s *Server) stopLocal() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGCONT) // a paused server cannot die otherwise
	_ = s.cmd.Process.Kill()
	<-s.done
	s.cmd, s.done = nil, nil
}

func waitReady(addr string, exited <-chan struct{}) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	defer c.Close()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return errors.New("redis-server exited")
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return errors.New("no answer to PING within 5s")
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
