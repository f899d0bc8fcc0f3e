package ratelimit

import (
	"embed"
	"slices"

	"github.com/redis/go-redis/v9"
)

// Every script this package sends Redis is one of these files, byte for byte: nothing is
// concatenated, cut or templated at run time. An algorithm's script (sliding_log.lua, …), a
// batch's (package batch's) and a sequence's (sequence/) are generated from the parts in lua/ by
// scripts_test.go (its first line says how), so that the algorithm is written once; the others
// are written by hand. They run with EVALSHA, falling back to EVAL on NOSCRIPT
// (redis.Script.Run): after the first call on a server only a script's hash travels.
//
//go:embed *.lua sequence/*.lua
var scriptFiles embed.FS

// script is the file name's script.
func script(name string) *redis.Script {
	src, err := scriptFiles.ReadFile(name)
	if err != nil {
		panic("ratelimit: no script " + name)
	}
	return redis.NewScript(string(src))
}

// byAlgorithm is each algorithm's script.
func byAlgorithm() map[Algorithm]*redis.Script {
	s := make(map[Algorithm]*redis.Script)
	for _, a := range Algorithms() {
		s[a] = script(string(a) + ".lua")
	}
	return s
}

var (
	// scripts decide one request each (args.lua's arguments).
	scripts = byAlgorithm()
	// voucherScript grants and redeems (Grant, Redeem); slotScript holds and releases in-flight
	// slots (Hold, Release). Both take an algorithm's arguments.
	voucherScript = script("voucher.lua")
	slotScript    = script("slots.lua")
	// probeScript is what Ready and the breaker ask; forgetScript forgets a key (Forget);
	// publishScript tells the fleet of a forgotten key, and a layer of what it must hear
	// (Publish: package queue's moved turns).
	probeScript   = script("probe.lua")
	forgetScript  = script("forget.lua")
	publishScript = script("publish.lua")
)

// A sequenceScript holds the bodies a sequence may run (Step.body numbers them): the few that a
// PIX's admission or settlement uses, each in a script of its own that reads top to bottom, or,
// for a sequence with any other algorithm (a tier's), all of them.
type sequenceScript struct {
	bodies []int
	script *redis.Script
}

// sequenceScripts are tried in order: the first that holds every step's body runs the sequence.
// Their bodies are generated from sequenceBodies (scripts_test.go).
var sequenceScripts = func() []sequenceScript {
	var out []sequenceScript
	for _, s := range sequenceBodies {
		out = append(out, sequenceScript{bodies: s.bodies, script: script("sequence/" + s.name + ".lua")})
	}
	return out
}()

// sequenceBodies names each sequence script and the bodies it holds, in the order a reader meets
// them: a PIX's admission asks its look-up buckets (token_bucket) and its slot, then decides its
// limit (sliding_log); its settlement redeems a voucher, charges or refunds a bucket and gives
// the slot back; all holds every body.
var sequenceBodies = []struct {
	name   string
	bodies []int
}{
	{"admission", []int{bodyOf(TokenBucket), slotBody, bodyOf(SlidingLog)}},
	{"settlement", []int{voucherBody, bodyOf(TokenBucket), slotBody}},
	{"all", allBodies()},
}

// The bodies that are not an algorithm's, numbered after Algorithms().
var (
	voucherBody = len(Algorithms()) + 1
	slotBody    = len(Algorithms()) + 2
)

// bodyOf is algorithm a's body number: its place in Algorithms(), from 1.
func bodyOf(a Algorithm) int { return slices.Index(Algorithms(), a) + 1 }

// allBodies numbers every body.
func allBodies() []int {
	var all []int
	for i := range slotBody {
		all = append(all, i+1)
	}
	return all
}

// sequenceScriptFor is the first sequence script that holds every one of the steps' bodies.
func sequenceScriptFor(steps []Step) *redis.Script {
	for _, s := range sequenceScripts {
		if !slices.ContainsFunc(steps, func(st Step) bool { return !slices.Contains(s.bodies, st.body()) }) {
			return s.script
		}
	}
	return sequenceScripts[len(sequenceScripts)-1].script
}
