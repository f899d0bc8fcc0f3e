package redistest

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Cluster is a Redis Cluster of local redis-server processes: masters, each with replicas.
type Cluster struct {
	t     testing.TB
	Nodes []*Server
}

// StartCluster starts masters × (1 + replicas) cluster-enabled redis-servers on free loopback
// ports, joins them with redis-cli --cluster create, and waits until every node reports the
// cluster ok. A node that misses its master for 1s gets failed over (cluster-node-timeout), so
// failover tests stay short.
func StartCluster(t testing.TB, masters, replicas int) *Cluster {
	t.Helper()
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Fatalf("redistest: a cluster needs redis-cli (Debian: apt-get install redis-tools)")
	}
	c := &Cluster{t: t}
	var addrs []string
	for range masters * (1 + replicas) {
		s := startLocalWith(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "1000", "--cluster-require-full-coverage", "no")
		c.Nodes = append(c.Nodes, s)
		addrs = append(addrs, s.Addr())
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // its join wait has no bound of its own
	defer cancel()
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redistest: redis-cli --cluster create: %v\n%s", err, out)
	}
	c.WaitHealthy(30 * time.Second)
	return c
}

// Addrs are the nodes' addresses, seeds for a cluster client.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		addrs[i] = n.Addr()
	}
	return addrs
}

// Client returns a cluster client of the nodes, closed when the test ends.
func (c *Cluster) Client(tune func(*redis.ClusterOptions)) *redis.ClusterClient {
	opt := &redis.ClusterOptions{Addrs: c.Addrs()}
	if tune != nil {
		tune(opt)
	}
	rc := redis.NewClusterClient(opt)
	c.t.Cleanup(func() { _ = rc.Close() })
	return rc
}

// WaitHealthy waits until every running node says cluster_state:ok, all slots are served, and
// every replica has synchronized with its master (a replica that never did cannot take over).
func (c *Cluster) WaitHealthy(within time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(within)
	for {
		if c.healthy() {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("redistest: cluster not healthy within %v", within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (c *Cluster) healthy() bool {
	for _, n := range c.Nodes {
		if !n.running() {
			continue
		}
		info, err := n.do("CLUSTER", "INFO")
		if err != nil || !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_slots_ok:16384") {
			return false
		}
		repl, err := n.do("INFO", "replication")
		if err != nil || strings.Contains(repl, "role:slave") && !strings.Contains(repl, "master_link_status:up") {
			return false
		}
	}
	return true
}

// MasterOf returns the node that serves key's slot now.
func (c *Cluster) MasterOf(key string) *Server {
	c.t.Helper()
	for _, n := range c.Nodes {
		if !n.running() {
			continue
		}
		slot, err := n.do("CLUSTER", "KEYSLOT", key)
		if err != nil {
			continue
		}
		nodes, err := n.do("CLUSTER", "NODES")
		if err != nil {
			continue
		}
		s, _ := strconv.Atoi(slot)
		for _, line := range strings.Split(nodes, "\n") {
			f := strings.Fields(line)
			if len(f) < 9 || !strings.Contains(f[2], "master") || strings.Contains(f[2], "fail") {
				continue
			}
			for _, r := range f[8:] {
				lo, hi, _ := strings.Cut(r, "-")
				a, _ := strconv.Atoi(lo)
				b := a
				if hi != "" {
					b, _ = strconv.Atoi(hi)
				}
				if s >= a && s <= b {
					addr := strings.SplitN(f[1], "@", 2)[0]
					for _, m := range c.Nodes {
						if m.Addr() == addr {
							return m
						}
					}
				}
			}
		}
	}
	c.t.Fatalf("redistest: no master serves %q", key)
	return nil
}

// Sentinel is a master, its replicas and three sentinels watching them as "mymaster".
type Sentinel struct {
	Master    *Server
	Replicas  []*Server
	Sentinels []*Server
}

// MasterName is the name the sentinels know the master by.
const MasterName = "mymaster"

// StartSentinel starts a master, replicas replicas of it, and three sentinels that fail the
// master over after one second of silence.
func StartSentinel(t testing.TB, replicas int) *Sentinel {
	t.Helper()
	st := &Sentinel{Master: startLocalWith(t)}
	host, port := splitAddr(st.Master.Addr())
	for range replicas {
		st.Replicas = append(st.Replicas, startLocalWith(t, "--replicaof", host, port))
	}
	for range 3 {
		s := &Server{t: t, dir: t.TempDir(), args: []string{"--sentinel"}, conf: fmt.Sprintf(
			"sentinel monitor %[1]s %[2]s %[3]s 2\nsentinel down-after-milliseconds %[1]s 1000\n"+
				"sentinel failover-timeout %[1]s 5000\nsentinel parallel-syncs %[1]s 1\n", MasterName, host, port)}
		s.bin, _ = exec.LookPath("redis-server")
		s.startLocal()
		t.Cleanup(s.stopLocal)
		st.Sentinels = append(st.Sentinels, s)
	}
	// Wait until the sentinels know the replicas (they learn them from the master's INFO).
	deadline := time.Now().Add(20 * time.Second)
	for {
		out, err := st.Sentinels[0].do("SENTINEL", "REPLICAS", MasterName)
		if err == nil && strings.Count(out, "ip") >= replicas && replicas > 0 || replicas == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: sentinels did not discover the replicas")
		}
		time.Sleep(100 * time.Millisecond)
	}
	return st
}

// Addrs are the sentinels' addresses.
func (st *Sentinel) Addrs() []string {
	var addrs []string
	for _, s := range st.Sentinels {
		addrs = append(addrs, s.Addr())
	}
	return addrs
}

func splitAddr(addr string) (string, string) {
	i := strings.LastIndex(addr, ":")
	return addr[:i], addr[i+1:]
}

// StartWith starts a local redis-server with extra arguments (such as a maxmemory policy), and
// stops it when t ends. It needs redis-server on PATH.
func StartWith(t testing.TB, args ...string) *Server {
	t.Helper()
	return startLocalWith(t, args...)
}

// startLocalWith starts a local redis-server with extra arguments.
func startLocalWith(t testing.TB, args ...string) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("redistest: clusters and sentinels need a local redis-server")
	}
	s := &Server{t: t, bin: bin, dir: t.TempDir(), args: args}
	s.startLocal()
	t.Cleanup(s.stopLocal)
	return s
}

func (s *Server) running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd != nil
}

// do sends one command to this server alone and returns its reply as text.
func (s *Server) do(args ...any) (string, error) {
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1, DialTimeout: 500 * time.Millisecond,
		ReadTimeout: time.Second})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	v, err := c.Do(ctx, args...).Result()
	return fmt.Sprint(v), err
}
