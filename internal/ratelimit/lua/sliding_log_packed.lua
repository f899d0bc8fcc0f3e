-- sliding_log_packed.lua: the sliding-window log of sliding_log.lua, deciding exactly as it does,
-- stored as one string per key instead of a sorted set.
-- (prelude.lua, put before it, holds one decision's clock, arguments and reply.)
--
-- A key holds the admission times inside its window when it was last written, ascending, 4 bytes
-- each: big-endian microseconds since the epoch modulo 2^32 (71 minutes). Its times span at most
-- a window, and its newest is at most a window and a quarter old (the TTL, below); windows are at
-- most 28 minutes (Policy.Validate), so both are under 2^31 µs: the newest time is the one
-- nearest now with its 32 bits, and each other the one nearest the newest. No request ids: a
-- decision needs only the times, and a withdrawal removes one admission at its time. At limit 10 that is 40 bytes, which Redis stores inline
-- with the key's object (an embstr, up to 44 bytes), where the sorted set keeps a member, a score
-- and their index for each entry.
--
-- A decision is one GET and, when it admits, one SET: two redis.calls whatever the limit, where
-- the sorted set needs four to seven. The first time inside the window is found by binary
-- search, so a limit of thousands reads a dozen entries, not thousands.
--
-- The key must outlive its newest entry by a window. Setting its TTL costs Redis more than the
-- rest of a decision (an expiry to store, and the command rewritten with an absolute time for
-- replication), so the key expires a window after the end of its newest entry's quarter of a
-- window (quarters aligned to the epoch), and an admission sets the TTL only when it starts a new
-- quarter; within one, the SET keeps it. A withdrawal sets it from the newest entry it leaves.
-- So a key lives at least a window past its newest entry, and at most a window and a quarter.

local W, SPAN = 4, 2 ^ 32                                           -- bytes per entry; times are kept modulo SPAN

-- at(s, i) is the i-th time of log s (1-based): its 32 bits, completed to the time nearest ref.
local ref
local function at(s, i)
  local a, b, c, d = byte(s, i * W - 3, i * W)
  local x = ((a * 256 + b) * 256 + c) * 256 + d
  return x + SPAN * floor((ref - x) / SPAN + 0.5)
end

-- pack(t) is time t modulo SPAN as W bytes, most significant first.
local function pack(t)
  t = t % SPAN
  local d = t % 256
  t = (t - d) / 256
  local c = t % 256
  t = (t - c) / 256
  local b = t % 256
  return char((t - b) / 256, b, c, d)
end

-- quarter(t, window) numbers t's quarter of a window, counted from the epoch; ttl(t, window) is
-- the TTL, in ms from now, of a key whose newest time is t: until a window after that quarter.
local function quarter(t, window)
  return floor(t * 4 / window)
end
local function ttl(t, window)
  return ceil(((quarter(t, window) + 1) * window / 4 + window - now) / 1000)
end

-- after(s, m, since) is the index of the first of the m times of s later than since, or m + 1.
-- Times only grow along the log, and a decision mostly finds none or a few of them left behind:
-- it gallops from the oldest (1, 2, 4, ...), then searches between, so it reads one time when
-- none has left and about 2·log2(m) when all have, never each one.
local function after(s, m, since)
  local lo, hi = 1, 1
  while hi <= m and at(s, hi) <= since do
    lo, hi = hi + 1, hi * 2
  end
  hi = min(hi, m + 1)
  while lo < hi do                                                 -- the first later time is in [lo, hi]
    local mid = floor((lo + hi) / 2)
    if at(s, mid) > since then hi = mid else lo = mid + 1 end
  end
  return lo
end

-- One decision's tables, reused by every member of a batch: a decision writes entries 1..n
-- before it reads them.
local live, counts, remaining, reset = {}, {}, {}, {}

---- each decision: what follows runs once per request (what precedes it, once per call)
if undo_at then                                                    -- withdraw: drop one admission made at undo_at
  local removed = 0
  for i = 1, n do
    local s = redis.call('GET', keys[i]) or ''
    local m = #s / W
    ref = now
    if m > 0 then ref = at(s, m) end                               -- the newest, nearest now; the others, nearest it
    local k = after(s, m, undo_at - 1)                             -- the first time at or after undo_at
    if k <= m and at(s, k) == undo_at then
      s = sub(s, 1, (k - 1) * W) .. sub(s, k * W + 1)
      local px = #s > 0 and ttl(at(s, m - 1), windows[i]) or 0
      if px > 0 then redis.call('SET', keys[i], s, 'PX', px) else redis.call('DEL', keys[i]) end
      removed = removed + 1
    end                                                            -- else it has left the window: it counts nowhere
  end
  return removed
end

local full = false
for i = 1, n do
  local s = redis.call('GET', keys[i]) or ''
  local m = #s / W
  ref = now
  if m > 0 then ref = at(s, m) end                                 -- the newest, nearest now; the others, nearest it
  local k = after(s, m, now - windows[i])                          -- times at or before now - window have left it
  live[i] = sub(s, (k - 1) * W + 1)                                -- exactly the last window's admissions
  counts[i] = m - k + 1
  if counts[i] >= limits[i] then full = true end                   -- one full key refuses the whole request
end

for i = 1, n do
  local log, count, limit, window = live[i], counts[i], limits[i], windows[i]
  ref = now                                                        -- the live times lie within a window of now
  local last = count > 0 and at(log, count)                        -- the newest, when any is live (an older one's quarter is over)
  if not full and cost > 0 then                                    -- cost 0 only asks (AskStep): it records nothing
    local t = max(now, last or now)                                -- a clock that steps back never reorders the log
    log, count = log .. pack(t), count + 1                         -- record the admission; a refusal writes nothing
    if last and quarter(last, window) == quarter(t, window) then
      redis.call('SET', keys[i], log, 'KEEPTTL')                   -- the newest's quarter as before: its TTL holds
    else
      redis.call('SET', keys[i], log, 'PX', ttl(t, window))
    end
  end
  -- Room for one more appears when the entry of rank count-limit leaves the window: the oldest,
  -- unless the limit was lowered below what the key already holds.
  local rank = count - limit
  if count == 0 then
    reset[i] = 0
  elseif rank <= 0 then
    reset[i] = at(log, 1) + window - now
  else
    reset[i] = at(log, rank + 1) + window - now
  end
  remaining[i] = max(0, limit - count)
end
return reply(not full, remaining, reset)
