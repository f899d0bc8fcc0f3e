-- fixed_window.lua: one counter per calendar window, over one or more keys, decided atomically.
--
-- Windows are aligned to the epoch (a 1-minute window runs from :00 to :59), so every replica
-- agrees where one ends. Each key holds "<window index>:<count>"; a count from an earlier window
-- is void. Cheap (one short string per key) and simple, but a client can spend its limit at the
-- end of one window and again at the start of the next: up to twice the limit in a moment.
--
-- KEYS[i]      the counter of the i-th identity
-- ARGV[1]      this request's id: unused (a counter cannot tell a retry from a new request)
-- ARGV[2]      now in microseconds, or '' to read the Redis clock (tests inject time)
-- ARGV[3i]     limit of KEYS[i]
-- ARGV[3i+1]   window of KEYS[i] in microseconds (a whole number of milliseconds)
-- ARGV[3i+2]   burst: unused
--
-- Returns {allowed, remaining_1, reset_1, ..., now}; reset_i is the time in microseconds until the
-- window of KEYS[i] ends and its count starts again from zero (0 when nothing is counted).

local now = tonumber(ARGV[2])
if now == nil then
  local t = redis.call('TIME')                                -- the one clock every replica shares
  now = t[1] * 1000000 + t[2]
end

local n = #KEYS
local limits, windows, counts, indexes = {}, {}, {}, {}
local full = false
for i = 1, n do
  local limit, window = tonumber(ARGV[3 * i]), tonumber(ARGV[3 * i + 1])
  local index = math.floor(now / window)                       -- which calendar window now falls in
  local count = 0
  local v = redis.call('GET', KEYS[i])
  if v then
    local w, c = string.match(v, '^(%d+):(%d+)$')
    if tonumber(w) == index then count = tonumber(c) end        -- an earlier window's count is void
  end
  limits[i], windows[i], counts[i], indexes[i] = limit, window, count, index
  if count >= limit then full = true end                        -- one full key refuses the whole request
end

local out = {full and 0 or 1}
for i = 1, n do
  local limit, window, count = limits[i], windows[i], counts[i]
  local reset = (indexes[i] + 1) * window - now                  -- until this window ends
  if not full then
    count = count + 1                                           -- record; a refusal is never counted
    redis.call('SET', KEYS[i], string.format('%d:%d', indexes[i], count),
      'PX', math.ceil(reset / 1000))                            -- the count dies with its window
  end
  if count == 0 then reset = 0 end
  out[2 * i] = math.max(0, limit - count)
  out[2 * i + 1] = reset
end
out[#out + 1] = now                                                -- the time decided, for undo.lua
return out
