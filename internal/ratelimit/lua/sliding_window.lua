-- sliding_window.lua: the sliding window counter (as Cloudflare runs it), over one or more keys,
-- decided atomically.
-- (prelude.lua, put before it, holds one decision's clock, arguments and reply.)
--
-- Two counters per key, this calendar window's and the previous one's, and an estimate of the
-- last full window's traffic that weighs the previous count by how much of it the sliding
-- window still covers:
--
--   estimate = previous × (window − elapsed) / window + current
--
-- A request is admitted when estimate + 1 ≤ limit. One short string per key,
-- "<window index>:<previous count>:<current count>", like a fixed window, without its boundary
-- burst; exact when the previous window's traffic was spread evenly, off when it was not (see
-- doc.go for the bound). All arithmetic is on integers (×window), so Redis and the Go model agree
-- to the microsecond. reset_i is the time until the estimate has dropped enough for remaining_i
-- to grow by one.

-- stored(i) is keys[i]'s window index and counts, or nil for an absent key or one stored under
-- another window length: a window starting more than an hour and more than a window ahead is
-- no clock's step back but a policy's window raised (the key's name does not hold it), decades
-- ahead, and would lock the key that long.
local function stored(i)
  local v = redis.call('GET', keys[i])
  if not v then return nil end
  local w, p, c = string.match(v, '^(%d+):(%d+):(%d+)$')
  w = tonumber(w)
  if w * windows[i] - now > max(windows[i], 3600000000) then return nil end
  return w, tonumber(p), tonumber(c)
end

---- each decision: what follows runs once per request (what precedes it, once per call)
if undo_at then                                                    -- withdraw: one less where it was counted
  local removed = 0
  for i = 1, n do
    local index = floor(undo_at / windows[i])
    local w, p, c = stored(i)
    if w == index and c > 0 then
      c, removed = c - 1, removed + 1                              -- still in the current count
    elseif w == index + 1 and p > 0 then
      p, removed = p - 1, removed + 1                              -- a later write made it the previous count
    end                                                            -- else it weighs nothing any more
    if w then
      redis.call('SET', keys[i], string.format('%d:%d:%d', w, p, c), 'KEEPTTL')
    end
  end
  return removed
end

-- A key whose window is later than now's (the clock stepped back since it was stored) is decided
-- as at that window's start (at, later than now): its counts stand, and the previous window's
-- weighs whole. (A withdrawal of an admission decided so names the earlier now, and finds its
-- window over: it takes nothing back, erring toward fewer admissions, as fixed_window.lua's.)
local prevs, currs, indexes, ats = {}, {}, {}, {}
local full = false
for i = 1, n do
  local limit, window = limits[i], windows[i]
  local index, at = floor(now / window), now
  local prev, curr = 0, 0
  local w, p, c = stored(i)
  if w and w > index then
    index, at = w, w * window
  end
  if w == index then
    prev, curr = p, c
  elseif w == index - 1 then
    prev = c                                                       -- the stored current window is now the previous one
  end                                                              -- anything older weighs nothing
  local elapsed = at - index * window
  if prev * (window - elapsed) + (curr + 1) * window > limit * window then
    full = true                                                    -- estimate + 1 > limit: one full key refuses all
  end
  prevs[i], currs[i], indexes[i], ats[i] = prev, curr, index, at
end

local remaining, reset = {}, {}
for i = 1, n do
  local limit, window, prev, curr = limits[i], windows[i], prevs[i], currs[i]
  local elapsed = ats[i] - indexes[i] * window
  if not full and cost > 0 then                                    -- cost 0 only asks (AskStep): it records nothing
    curr = curr + 1                                                -- record; a refusal is never counted
    redis.call('SET', keys[i], string.format('%d:%d:%d', indexes[i], prev, curr),
      'PX', ceil((2 * window - elapsed + ats[i] - now) / 1000))  -- needed until the next window ends
  end
  local spent = prev * (window - elapsed) + curr * window           -- estimate × window
  remaining[i] = max(0, floor((limit * window - spent) / window))
  -- Reset: the first moment the estimate is at most target = limit − remaining − 1.
  local target = limit - remaining[i] - 1
  reset[i] = 0
  if spent > 0 and target >= 0 then
    if curr <= target then                                         -- within this window, as the previous count fades
      reset[i] = window - floor((target - curr) * window / prev) - elapsed
    else                                                           -- next window: this count becomes the fading one
      reset[i] = window - elapsed + window - floor(target * window / curr)
    end
    reset[i] = reset[i] + ats[i] - now
  end
end
return reply(not full, remaining, reset)
