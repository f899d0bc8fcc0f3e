-- sliding_window.lua: the sliding window counter (as Cloudflare runs it), over one or more keys,
-- decided atomically.
--
-- Two counters per key, this calendar window's and the previous one's, and an estimate of the
-- last full window's traffic that weighs the previous count by how much of it the sliding
-- window still covers:
--
--   estimate = previous × (window − elapsed) / window + current
--
-- A request is admitted when estimate + 1 ≤ limit. One short string per key, like a fixed
-- window, without its boundary burst; exact when the previous window's traffic was spread evenly,
-- off when it was not (see doc.go for the bound). All arithmetic is on integers (×window), so
-- Redis and the Go model agree to the microsecond.
--
-- KEYS[i]      "<window index>:<previous count>:<current count>" of the i-th identity
-- ARGV[1]      this request's id: unused (a counter cannot tell a retry from a new request)
-- ARGV[2]      now in microseconds, or '' to read the Redis clock (tests inject time)
-- ARGV[3i]     limit of KEYS[i]; ARGV[3i+1] window in microseconds; ARGV[3i+2] burst: unused
--
-- Returns {allowed, remaining_1, reset_1, ..., now}; reset_i is the time in microseconds until the
-- estimate has dropped enough for remaining_i to grow by one (0 when nothing is counted).

local now = tonumber(ARGV[2])
if now == nil then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end

local n = #KEYS
local limits, windows, prevs, currs, indexes = {}, {}, {}, {}, {}
local full = false
for i = 1, n do
  local limit, window = tonumber(ARGV[3 * i]), tonumber(ARGV[3 * i + 1])
  local index = math.floor(now / window)
  local prev, curr = 0, 0
  local v = redis.call('GET', KEYS[i])
  if v then
    local w, p, c = string.match(v, '^(%d+):(%d+):(%d+)$')
    w = tonumber(w)
    if w == index then
      prev, curr = tonumber(p), tonumber(c)
    elseif w == index - 1 then
      prev = tonumber(c)                                          -- the stored current window is now the previous one
    end                                                           -- anything older weighs nothing
  end
  local elapsed = now - index * window
  if prev * (window - elapsed) + (curr + 1) * window > limit * window then
    full = true                                                   -- estimate + 1 > limit: one full key refuses all
  end
  limits[i], windows[i], prevs[i], currs[i], indexes[i] = limit, window, prev, curr, index
end

local out = {full and 0 or 1}
for i = 1, n do
  local limit, window, prev, curr = limits[i], windows[i], prevs[i], currs[i]
  local elapsed = now - indexes[i] * window
  if not full then
    curr = curr + 1                                               -- record; a refusal is never counted
    redis.call('SET', KEYS[i], string.format('%d:%d:%d', indexes[i], prev, curr),
      'PX', math.ceil((2 * window - elapsed) / 1000))             -- needed until the next window ends
  end
  local spent = prev * (window - elapsed) + curr * window          -- estimate × window
  local remaining = math.floor((limit * window - spent) / window)
  if remaining < 0 then remaining = 0 end
  -- Reset: the first moment the estimate is at most target = limit − remaining − 1.
  local target = limit - remaining - 1
  local reset = 0
  if spent > 0 and target >= 0 then
    if curr <= target then                                        -- within this window, as the previous count fades
      reset = window - math.floor((target - curr) * window / prev) - elapsed
    else                                                          -- next window: this count becomes the fading one
      reset = window - elapsed + window - math.floor(target * window / curr)
    end
  end
  out[2 * i] = remaining
  out[2 * i + 1] = reset
end
out[#out + 1] = now                                                -- the time decided, for undo.lua
return out
