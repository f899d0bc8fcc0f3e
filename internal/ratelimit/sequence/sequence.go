// Package sequence runs the several steps of one Decide in one script call, atomic: a PIX asks
// its look-up buckets and its in-flight slot, then decides its own limit and takes the slot, and
// nothing comes between them; its settlement redeems a voucher, refunds the buckets and gives
// the slot back, in one more. It is the Limiter's SequenceRunner (ratelimit.Options.Sequences).
//
// What it buys: a request of several steps costs one round trip, not one per step, and a refused
// step leaves nothing of the steps after it. What it costs: a script per set of bodies (below),
// and no batching (a sequence is sent alone). On a cluster the Limiter does not use it: a
// sequence's keys live on several nodes.
//
// Its scripts are files of this directory, generated from lua/ (scripts_test.go of the core):
// each holds some bodies, lua/<name>.lua wrapped in decisions['<name>'], and sequence.lua's loop,
// which runs the steps' bodies in order. A sequence runs in the first script holding all of its
// steps' bodies: admission.lua (a PIX's admission with the default algorithms: token_bucket,
// slots, sliding_log), settlement.lua (voucher, token_bucket, slots), or all.lua (every body: a
// tier's other algorithm).
package sequence

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"regexp"
	"slices"

	"github.com/pixlimit/pixlimit/internal/ratelimit"
	"github.com/redis/go-redis/v9"
)

//go:embed *.lua
var files embed.FS

// A Runner runs sequences on rdb.
type Runner struct {
	rdb     redis.Scripter
	scripts []script
}

// script is one of the files, and the bodies it holds.
type script struct {
	bodies []string
	s      *redis.Script
}

// body finds a script's bodies: the lines that define decisions['<name>'].
var body = regexp.MustCompile(`(?m)^decisions\['([a-z_]+)'\] = function\(\)$`)

// New returns the Runner of sequences on rdb (a breaker's client, say): every script of this
// directory, those that hold the fewest bodies first.
func New(rdb redis.Scripter) *Runner {
	r := &Runner{rdb: rdb}
	names, _ := fs.Glob(files, "*.lua")
	for _, name := range names {
		src, _ := files.ReadFile(name)
		s := script{s: redis.NewScript(string(src))}
		for _, m := range body.FindAllStringSubmatch(string(src), -1) {
			s.bodies = append(s.bodies, m[1])
		}
		r.scripts = append(r.scripts, s)
	}
	slices.SortStableFunc(r.scripts, func(a, b script) int { return len(a.bodies) - len(b.bodies) })
	return r
}

// Scripts are the sequences' scripts: what package warm loads.
func (r *Runner) Scripts() []*redis.Script {
	var out []*redis.Script
	for _, s := range r.scripts {
		out = append(out, s.s)
	}
	return out
}

// RunSequence runs steps in the first script that holds each one's body: sequence.lua's
// arguments, then its reply cut into the replies of the steps that ran.
func (r *Runner) RunSequence(ctx context.Context, steps []ratelimit.StepCall) ([]ratelimit.Reply, error) {
	s, err := r.scriptFor(steps)
	if err != nil {
		return nil, err
	}
	args := []any{len(steps)}
	var keys []string
	for _, st := range steps {
		c := st.Call
		args = append(args, st.Body, len(st.Keys), c.ID, c.NowArg(), c.Op.Arg())
		for _, k := range c.Settings {
			args = append(args, k[0], k[1], k[2])
		}
		keys = append(keys, st.Keys...)
	}
	vals, err := s.Run(ctx, r.rdb, keys, args...).Int64Slice()
	if err != nil {
		return nil, fmt.Errorf("%w: sequence: %w", ratelimit.ErrUnavailable, err)
	}
	var replies []ratelimit.Reply
	for i, st := range steps {
		size := ratelimit.ReplySize(len(st.Keys), st.Queued)
		if len(vals) == 0 {
			break // refused: the steps after it did not run
		}
		if len(vals) < size {
			return nil, fmt.Errorf("%w: sequence replied %d values for step %d of %d keys", ratelimit.ErrUnavailable, len(vals), i+1, len(st.Keys))
		}
		reply, err := ratelimit.ParseReply(vals[:size], len(st.Keys), st.Queued)
		if err != nil {
			return nil, err
		}
		replies, vals = append(replies, reply), vals[size:]
	}
	return replies, nil
}

// scriptFor is the first script that holds every step's body.
func (r *Runner) scriptFor(steps []ratelimit.StepCall) (*redis.Script, error) {
	for _, s := range r.scripts {
		if !slices.ContainsFunc(steps, func(st ratelimit.StepCall) bool { return !slices.Contains(s.bodies, st.Body) }) {
			return s.s, nil
		}
	}
	return nil, fmt.Errorf("sequence: no script holds the bodies of %d steps", len(steps))
}
