package ratelimit

import (
	"embed"

	"github.com/redis/go-redis/v9"
)

// Every script this package sends Redis is one of these files, byte for byte: nothing is
// concatenated, cut or templated at run time. An algorithm's script (sliding_log.lua, …), and
// the layers' that decide (package batch's, slots', grants' and sequence's) are generated from
// the parts in lua/ by scripts_test.go (its first line says how), so that each body is written
// once; the others are written by hand. They run with EVALSHA, falling back to EVAL on NOSCRIPT
// (redis.Script.Run): after the first call on a server only a script's hash travels.
//
//go:embed *.lua
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
	// probeScript is what Ready and the breaker ask; forgetScript forgets a key (Forget).
	probeScript  = script("probe.lua")
	forgetScript = script("forget.lua")
)
