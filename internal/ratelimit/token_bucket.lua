-- token_bucket.lua: a token bucket with continuous refill, over one or more keys, decided
-- atomically.
--
-- A bucket holds up to `burst` tokens and gains `limit` tokens per `window`, continuously; a
-- request takes one token or is refused. Tokens are kept multiplied by the window in
-- microseconds (a "scaled" token is 1/window of a token), so the refill of `limit` scaled units
-- per microsecond is exact integer arithmetic. A full bucket needs no key at all: the key lives
-- exactly until the bucket would be full again.
--
-- KEYS[i]      "<scaled tokens>:<time of that count, µs>" of the i-th identity
-- ARGV[1]      this request's id: unused (a bucket cannot tell a retry from a new request)
-- ARGV[2]      now in microseconds, or '' to read the Redis clock (tests inject time)
-- ARGV[3i]     limit: tokens per window; ARGV[3i+1] window in microseconds; ARGV[3i+2] burst
--
-- Returns {allowed, remaining_1, reset_1, ..., now}: remaining_i is the whole tokens left; reset_i the
-- time in microseconds until there is one more (0 when the bucket is full).

local now = tonumber(ARGV[2])
if now == nil then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end

local n = #KEYS
local limits, windows, capacities, levels = {}, {}, {}, {}
local full = false
for i = 1, n do
  local limit, window, burst = tonumber(ARGV[3 * i]), tonumber(ARGV[3 * i + 1]), tonumber(ARGV[3 * i + 2])
  local capacity = burst * window                                  -- a full bucket, scaled
  local level = capacity                                           -- no key: full
  local v = redis.call('GET', KEYS[i])
  if v then
    local tokens, at = string.match(v, '^(%d+):(%d+)$')
    tokens, at = tonumber(tokens), tonumber(at)
    local elapsed = math.max(0, now - at)
    if elapsed >= (capacity - tokens) / limit then
      level = capacity                                             -- refilled to the brim (and no overflow)
    else
      level = tokens + elapsed * limit                             -- refill since the last admission
    end
  end
  limits[i], windows[i], capacities[i], levels[i] = limit, window, capacity, level
  if level < window then full = true end                           -- less than one token: refuse the whole request
end

local out = {full and 0 or 1}
for i = 1, n do
  local limit, window, capacity, level = limits[i], windows[i], capacities[i], levels[i]
  if not full then
    level = level - window                                         -- take one token; a refusal takes none
    redis.call('SET', KEYS[i], string.format('%d:%d', level, now),
      'PX', math.max(1, math.ceil((capacity - level) / limit / 1000))) -- gone when full again
  end
  local remaining = math.floor(level / window)
  local reset = 0
  if level < capacity then
    reset = math.ceil(((remaining + 1) * window - level) / limit)  -- until the next whole token
  end
  out[2 * i] = remaining
  out[2 * i + 1] = reset
end
out[#out + 1] = now                                                -- the time decided, for undo.lua
return out
