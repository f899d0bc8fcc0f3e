-- fixed_window.lua: one counter per calendar window, over one or more keys, decided atomically.
-- (prelude.lua, put before it, holds one decision's clock, arguments and reply.)
--
-- Windows are aligned to the epoch (a 1-minute window runs from :00 to :59), so every replica
-- agrees where one ends. Each key holds "<window index>:<count>"; a count from an earlier window
-- is void. Cheap (one short string per key) and simple, but a client can spend its limit at the
-- end of one window and again at the start of the next: up to twice the limit in a moment.
-- reset_i is the time until the window of keys[i] ends and its count starts again from zero.

-- voidAhead says whether a stored window index w of length window starts too far ahead of now
-- to be a clock's step back: more than an hour and more than a window.
local function voidAhead(w, window)
  return w * window - now > max(window, 3600000000)
end

-- window(i) is keys[i]'s calendar window and its count: now's window, or the next one stored
-- before the clock stepped back (its count stands until it ends; an admission counted in it then
-- is withdrawn by the earlier now it was decided at, so not at all: fewer admissions, not more).
-- A window that starts more than an hour ahead (and more than a window) was stored under a
-- shorter window length (the policy's was raised: the key's name does not hold it), decades
-- ahead, and read as a clock step it would lock the key that long: void too (voidAhead).
local function window(i)
  local index = floor(now / windows[i])                            -- which calendar window now falls in
  local v = redis.call('GET', keys[i])
  if not v then return index, 0 end
  local w, c = string.match(v, '^(%d+):(%d+)$')
  w, c = tonumber(w), tonumber(c)
  if w < index or voidAhead(w, windows[i]) then return index, 0 end -- an earlier window's count, or another length's, is void
  return w, c
end

---- each decision: what follows runs once per request (what precedes it, once per call)
if undo_at then                                                    -- withdraw: one less in the window it was counted in
  local removed = 0
  for i = 1, n do
    local index = floor(undo_at / windows[i])
    local w, c = window(i)
    if w == index and c > 0 then                                   -- else its window is over: it counts nowhere now
      redis.call('SET', keys[i], string.format('%d:%d', index, c - 1), 'KEEPTTL')
      removed = removed + 1
    end
  end
  return removed
end

local counts, indexes = {}, {}
local full = false
for i = 1, n do
  indexes[i], counts[i] = window(i)
  if counts[i] >= limits[i] then full = true end                   -- one full key refuses the whole request
end

local remaining, reset = {}, {}
for i = 1, n do
  local c = counts[i]
  reset[i] = (indexes[i] + 1) * windows[i] - now                   -- until this window ends
  if not full and cost > 0 then                                    -- cost 0 only asks (AskStep): it records nothing
    c = c + 1                                                      -- record; a refusal is never counted
    redis.call('SET', keys[i], string.format('%d:%d', indexes[i], c),
      'PX', ceil(reset[i] / 1000))                            -- the count dies with its window
  end
  if c == 0 then reset[i] = 0 end
  remaining[i] = max(0, limits[i] - c)
end
return reply(not full, remaining, reset)
