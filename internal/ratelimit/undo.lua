-- undo.lua: withdraws one request that a script admitted into one key.
--
-- Used only when one request's keys live in different Redis Cluster slots and cannot share a
-- script: each key is decided by its own script, and when one refuses, the others' admissions
-- are withdrawn here, so that a refused request consumes no quota in the end (see doc.go,
-- "Several keys in one decision").
--
-- KEYS[1]      the key
-- ARGV[1]      the algorithm that admitted the request
-- ARGV[2]      the request's id
-- ARGV[3]      when it was admitted, µs, by this node's clock (the admitting script's `now`)
-- ARGV[4]      limit; ARGV[5] window in microseconds; ARGV[6] burst
--
-- Returns 1 if something was withdrawn, 0 if there was nothing left to withdraw.

local key, algorithm, id = KEYS[1], ARGV[1], ARGV[2]
local at, limit, window, burst = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])

if algorithm == 'sliding_log' then
  return redis.call('ZREM', key, id)                               -- the entry is the request itself: exact
end

local v = redis.call('GET', key)
if not v then
  return 0                                                         -- expired meanwhile: it counts nowhere
end
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]

if algorithm == 'fixed_window' then
  local w, c = string.match(v, '^(%d+):(%d+)$')
  w, c = tonumber(w), tonumber(c)
  if w ~= math.floor(at / window) or c == 0 then
    return 0                                                       -- its window is over: it counts nowhere now
  end
  redis.call('SET', key, string.format('%d:%d', w, c - 1), 'KEEPTTL')
elseif algorithm == 'sliding_window' then
  local w, p, c = string.match(v, '^(%d+):(%d+):(%d+)$')
  w, p, c = tonumber(w), tonumber(p), tonumber(c)
  local index = math.floor(at / window)
  if w == index and c > 0 then
    c = c - 1                                                      -- still in the current count
  elseif w == index + 1 and p > 0 then
    p = p - 1                                                      -- a later write made it the previous count
  else
    return 0
  end
  redis.call('SET', key, string.format('%d:%d:%d', w, p, c), 'KEEPTTL')
elseif algorithm == 'token_bucket' then
  local level, since = string.match(v, '^(%d+):(%d+)$')
  local capacity = burst * window
  level = math.min(capacity, tonumber(level) + math.max(0, now - tonumber(since)) * limit)
  level = math.min(capacity, level + window)                       -- give the token back
  if level >= capacity then
    redis.call('DEL', key)                                         -- a full bucket needs no key
  else
    redis.call('SET', key, string.format('%d:%d', level, now), 'PX', math.max(1, math.ceil((capacity - level) / limit / 1000)))
  end
elseif algorithm == 'gcra' then
  local tat = tonumber(v) - window / limit                         -- move the schedule back one interval
  if tat <= now then
    redis.call('DEL', key)                                         -- caught up: an idle key needs no state
  else
    redis.call('SET', key, string.format('%.17g', tat), 'PX', math.max(1, math.ceil((tat - now) / 1000)))
  end
else
  return redis.error_reply('undo: unknown algorithm ' .. algorithm)
end
return 1
