-- prelude.lua: what every algorithm's script shares. Go prepends it to each of them
-- (algorithm.go), so each script below starts with the clock, its arguments and its reply in hand.
-- protocol.go is the Go side of these arguments and this reply: one encoder (call) and one
-- decoder (parseReply).
--
-- KEYS[i]      the state of the i-th identity, in the algorithm's own format
-- ARGV[1]      the request's id: unique per request (the sliding log records it; the others ignore it)
-- ARGV[2]      now in microseconds, or '' to read the Redis clock (tests inject time; never production)
-- ARGV[3]      '' to decide the request; or, to withdraw the request admitted at that time (µs, the
--              `now` its decision returned), that time: the script then undoes its admission; or
--              (token_bucket only) 'n' and a cost: decide a request that costs that many tokens (0:
--              whether one would be admitted, taking nothing; below 0: give that many back)
-- ARGV[3i+1]   limit of KEYS[i]: requests per window, at least 1
-- ARGV[3i+2]   window of KEYS[i] in microseconds (a whole number of milliseconds)
-- ARGV[3i+3]   burst of KEYS[i]: requests at once (the capacity of token_bucket and gcra; the limit
--              for the others)
--
-- A decision returns reply(allowed, remaining, reset) = {allowed, remaining_1, reset_1, ..., now}:
-- allowed is 1 or 0 for the whole request; remaining_i how many more KEYS[i] admits now; reset_i
-- the microseconds until it admits one more than that (0 when it holds nothing); now the time
-- decided. A withdrawal returns how many keys it took something back from.

local id = ARGV[1]
local now = tonumber(ARGV[2])
if now == nil then
  local t = redis.call('TIME')                                     -- {seconds, microseconds}: the one clock every replica shares
  now = t[1] * 1000000 + t[2]                                      -- < 2^53, so exact in a Lua number
end
local undo_at = tonumber(ARGV[3])                                  -- nil: decide
local cost = tonumber(string.match(ARGV[3], '^n(-?%d+)$') or 1)   -- what a request takes (token_bucket; < 0 gives back)
local n = #KEYS
local limits, windows, bursts = {}, {}, {}
for i = 1, n do
  limits[i], windows[i], bursts[i] = tonumber(ARGV[3 * i + 1]), tonumber(ARGV[3 * i + 2]), tonumber(ARGV[3 * i + 3])
end

local function reply(allowed, remaining, reset)
  local out = {allowed and 1 or 0}
  for i = 1, n do
    out[2 * i], out[2 * i + 1] = remaining[i], reset[i]
  end
  out[2 * n + 2] = now                                             -- the time decided: a withdrawal names it
  return out
end

-- the algorithm follows
