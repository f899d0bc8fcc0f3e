-- batch.lua: several decisions in one call, decided one after another, in the order given, as
-- the same decisions sent one by one in that order would be. Go wraps an algorithm's script
-- (prelude.lua and its body) in the function `decide`, whose KEYS and ARGV are one decision's,
-- and appends this loop (algorithm.go); a decision's own TIME, arguments and reply are
-- untouched, so the batch cannot decide otherwise than its members would alone.
--
-- ARGV[1]            how many decisions
-- then, per decision: its number of keys, its number of arguments, and its arguments
-- KEYS               every decision's keys, in order
--
-- Returns one reply per decision, as the algorithm's script returns it alone.

local out, k, pos = {}, 0, 2
for b = 1, tonumber(ARGV[1]) do
  local nkeys, nargs = tonumber(ARGV[pos]), tonumber(ARGV[pos + 1])
  pos = pos + 2
  local keys, argv = {}, {}
  for i = 1, nkeys do keys[i] = KEYS[k + i] end
  for i = 1, nargs do argv[i] = ARGV[pos + i - 1] end
  k, pos = k + nkeys, pos + nargs
  out[b] = decide(keys, argv)
end
return out
