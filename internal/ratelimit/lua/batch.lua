-- batch.lua: several decisions in one call, decided one after another, in the order given, as
-- the same decisions sent one by one in that order would be. A batch's script is prelude.lua,
-- members.lua, the algorithm's functions, its decision wrapped in the function `decide`, and
-- this loop: each member runs the very decision a lone call runs, on its own locals, and its
-- reply joins the batch's.
--
-- ARGV[1]            how many decisions
-- ARGV[2]            how many key settings
-- then, per decision: its number of keys, its id, its now ('' for the Redis clock), its operation,
--                    and per key the index of its setting (a batch's keys mostly share a
--                    policy, so each policy's three numbers travel and are parsed once)
--                    (a withdrawal is never batched: its reply is a number, not a list)
-- last, each setting: limit, window in ms, burst
-- KEYS               every decision's keys, in order
--
-- Members that read the Redis clock read it once for the batch: they decide at one instant, as
-- the same requests sent one by one within a microsecond would. Returns the members' replies,
-- one after another in one flat list (Go knows each one's length from its number of keys, and a
-- flat list of integers decodes without boxing each one).

local count, settings = tonumber(ARGV[1]), tonumber(ARGV[2])
local limit_of, window_of, burst_of = {}, {}, {}
local first = #ARGV - 3 * settings                                 -- the settings come last
for j = 1, settings do
  local a = first + 3 * j
  limit_of[j], window_of[j], burst_of[j] = tonumber(ARGV[a - 2]), tonumber(ARGV[a - 1]) * 1000, tonumber(ARGV[a])
end
local single = {}                                                  -- one-key tables by setting: the bodies only read them
local one = {}                                                     -- a one-key member's keys, reused: the bodies read keys[1..n]
local k, pos = 0, 3
for d = 1, count do
  n, id = tonumber(ARGV[pos]), ARGV[pos + 1]
  now = member_now(ARGV[pos + 2])
  undo_at, cost, max_wait = operation(ARGV[pos + 3])
  if n == 1 then
    local j = tonumber(ARGV[pos + 4])
    one[1] = KEYS[k + 1]
    local s = single[j]
    if s == nil then
      s = {{limit_of[j]}, {window_of[j]}, {burst_of[j]}}
      single[j] = s
    end
    keys, limits, windows, bursts = one, s[1], s[2], s[3]
  else
    keys, limits, windows, bursts = {}, {}, {}, {}
    for i = 1, n do
      local j = tonumber(ARGV[pos + 3 + i])
      keys[i], limits[i], windows[i], bursts[i] = KEYS[k + i], limit_of[j], window_of[j], burst_of[j]
    end
  end
  k, pos = k + n, pos + 4 + n
  decide()
end
return out
