package ratelimit

import (
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pixlimit/pixlimit/internal/testing/redistest"
)

// TestTheTextbookScriptRunsAlone: sliding_log.lua, run by itself with redis-cli --eval as its
// header (and the contract) says, admits 3 of 4 requests on a key with limit 3: remaining 2, 1,
// 0, then a refusal whose reset_ms is within the window; a refusal recorded nothing; and two keys
// decide together. The same file is what the replicas run (TestRedisRunsOnlyTheRepositorysScripts).
// Every algorithm's script then runs alone the same way, with the two arguments a person types and
// with every argument a replica sends (Call.Args).
func TestTheTextbookScriptRunsAlone(t *testing.T) {
	t.Parallel()
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Skip("redis-cli is not installed: apt-get install redis-tools")
	}
	srv := redistest.Start(t)
	host, port, _ := strings.Cut(srv.Addr(), ":")
	file := "sliding_log.lua"
	eval := func(args ...string) []int64 {
		t.Helper()
		out, err := exec.Command(cli, append([]string{"-h", host, "-p", port, "--eval", file}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("redis-cli --eval %s %s: %v\n%s", file, strings.Join(args, " "), err, out)
		}
		var reply []int64
		for _, f := range strings.Fields(string(out)) {
			n, err := strconv.ParseInt(f, 10, 64)
			if err != nil {
				t.Fatalf("reply %q: not integers", out)
			}
			reply = append(reply, n)
		}
		return reply
	}
	for i, want := range []struct {
		allowed, remaining int64
	}{{1, 2}, {1, 1}, {1, 0}, {0, 0}, {0, 0}} {
		got := eval("textbook", ",", "3", "60000")
		if len(got) < 3 || got[0] != want.allowed || got[1] != want.remaining {
			t.Fatalf("request %d: %v, want allowed %d and remaining %d", i+1, got, want.allowed, want.remaining)
		}
		if reset := time.Duration(got[2]) * time.Millisecond; reset <= 0 || reset > time.Minute {
			t.Errorf("request %d: reset_ms %d, want within the window", i+1, got[2])
		}
	}
	if n := srv.Client(nil).ZCard(t.Context(), "textbook").Val(); n != 3 {
		t.Errorf("the key holds %d entries after 3 admissions and 2 refusals, want 3", n)
	}
	if got := eval("one", "textbook", ",", "3", "60000"); len(got) < 5 || got[0] != 0 || got[1] != 3 || got[3] != 0 {
		t.Errorf("a fresh key with a full one: %v, want refused, the fresh key untouched (3 left)", got)
	}

	// Every algorithm's script runs alone the same way: LIMIT 3 admits 3 at once (a burst of 3,
	// by default the limit), then refuses; the queue gives the first its turn now, and refuses once
	// its 3 places are taken.
	for _, a := range Algorithms() {
		file = string(a) + ".lua"
		allowed := fiveInOneMinute(t, func(key string) []int64 {
			got := eval("alone:"+string(a)+key, ",", "3", "60000")
			if len(got) < 4 {
				t.Fatalf("%s: reply %v, want allowed, remaining, reset_ms, now and more", file, got)
			}
			return got
		})
		want := []int64{1, 1, 1, 0, 0}
		if a == LeakyBucket {
			want = []int64{1, 1, 1, 1, 0} // served now, then 3 waiting in their places
		}
		if !slices.Equal(allowed, want) {
			t.Errorf("redis-cli --eval %s alone:%s , 3 60000, 5 times: allowed %v, want %v", file, a, allowed, want)
		}

		// And with every argument a replica sends (Call.Args: the id, the capacity, the Redis
		// clock's "" and the plain decision's "" after the limit and the window), the same.
		p := Policy{Name: "replica", Limit: 3, Window: time.Minute, Algorithm: a}
		if a == LeakyBucket {
			p.Queue = 3
		}
		allowed = fiveInOneMinute(t, func(key string) []int64 {
			args := []string{"replica:" + string(a) + key, ","}
			c := NewCall(Check{Policy: p, Identity: "ana"})
			if a == LeakyBucket {
				c.Op = Op{kind: opQueue, within: 60_000_000} // a replica's request has a deadline: here, its turn within the minute
			}
			for _, v := range c.Args() {
				args = append(args, fmt.Sprint(v))
			}
			got := eval(args...)
			if len(got) < 4 {
				t.Fatalf("%s with a replica's arguments %q: reply %v, want allowed, remaining, reset_ms, now and more", file, args[2:], got)
			}
			return got
		})
		if !slices.Equal(allowed, want) {
			t.Errorf("redis-cli --eval %s with a replica's arguments, 5 times: allowed %v, want %v", file, allowed, want)
		}
	}
}

// fiveInOneMinute sends five requests by decide (on a key named with its suffix) and returns
// whether each was allowed. They run on Redis's clock, as a person's command line does, and the
// counters count per calendar minute: five that straddle a minute's end (their replies' now, at
// index 3, in two minutes) are sent again on a fresh key, once; five calls take far less than a
// minute, so the second try ends within one.
func fiveInOneMinute(t *testing.T, decide func(suffix string) []int64) []int64 {
	t.Helper()
	var allowed []int64
	for try := range 2 {
		allowed = allowed[:0]
		var minutes []int64
		for range 5 {
			got := decide(fmt.Sprintf(":%d", try))
			allowed, minutes = append(allowed, got[0]), append(minutes, got[3]/60_000_000)
		}
		if minutes[0] == minutes[4] {
			break
		}
	}
	return allowed
}
