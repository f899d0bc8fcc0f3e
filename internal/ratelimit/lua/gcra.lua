-- gcra.lua: the generic cell rate algorithm (the leaky bucket as a meter), over one or more keys,
-- decided atomically.
-- (prelude.lua, put before it, holds one decision's clock, arguments and reply.)
--
-- Requests are due one emission interval T = window / limit apart; a client may run ahead of
-- that schedule by up to `burst` intervals. The only state is the theoretical arrival time (TAT):
-- when the schedule would next be caught up. A request at `now` moves it to max(TAT, now) + T and
-- is admitted if the new TAT is at most burst × T ahead of now. It decides as a token bucket of
-- the same burst and rate does (TAT − now is the bucket's missing tokens, in time), with one
-- number of state instead of two. remaining_i is how many more requests fit now; reset_i the time
-- until one more does.
--
-- T is rarely a whole microsecond (60 s / 9), and a float TAT near 1.7e15 µs keeps quarters of a
-- microsecond only: its rounding, step after step, refused the last request of a burst. So the
-- TAT is kept exact, as whole microseconds and a fraction over the limit, and the decision
-- counts in 1/limit µs, where T is the window: exact integer arithmetic, as long as burst ×
-- window (µs) stays below 2^53 (Policy.Validate). A TAT of whole µs is stored as it is; one of
-- µs and n/limit as "<µs + 1>.0<n>", a number that a replica of the float schedule (during a
-- rolling update) reads as a TAT a microsecond later at most: stricter, never broken.

-- ahead(i) is how far keys[i]'s schedule is ahead of now, in 1/limit µs: 0 when caught up (an
-- idle schedule restarts now).
local function ahead(i)
  local v = redis.call('GET', keys[i])
  if not v then return 0 end
  local us, frac = string.match(v, '^(%d+)%.0(%d+)$')              -- "<µs + 1>.0<n>"
  if us then
    us, frac = tonumber(us) - 1, tonumber(frac)
  else
    us, frac = ceil(tonumber(v) or 0), 0                           -- whole µs; or a float replica's TAT, read whole, never less strict
  end
  return max(0, (us - now) * limits[i] + min(frac, limits[i] - 1)) -- (a fraction over a larger, earlier limit: under a µs)
end

-- store(i, a) keeps keys[i]'s schedule, a (1/limit µs) ahead of now, until it is caught up, or
-- drops one already caught up.
local function store(i, a)
  local limit = limits[i]
  if a <= 0 then
    redis.call('DEL', keys[i])                                     -- caught up: an idle key needs no state
  else
    local frac = a % limit
    local us = now + (a - frac) / limit
    local tat = frac == 0 and string.format('%d', us) or string.format('%d.0%d', us + 1, frac)
    redis.call('SET', keys[i], tat, 'PX', max(1, ceil(a / limit / 1000)))
  end
end

---- each decision: what follows runs once per request (what precedes it, once per call)
if undo_at then                                                    -- withdraw: move the schedule back one interval
  for i = 1, n do
    store(i, ahead(i) - windows[i])
  end
  return n
end

local aheads = {}
local full = false
for i = 1, n do
  aheads[i] = ahead(i)                                             -- in 1/limit µs, where T is the window
  if aheads[i] + windows[i] > bursts[i] * windows[i] then full = true end -- too far ahead: refuse all
end

local remaining, reset = {}, {}
for i = 1, n do
  local window, burst, a = windows[i], bursts[i], aheads[i]
  if not full and cost > 0 then                                    -- cost 0 only asks (AskStep): it records nothing
    a = a + window                                                 -- admit: the schedule moves one interval
    store(i, a)
  end
  -- How many more fit now: the room left ahead of the schedule, in whole intervals.
  remaining[i] = max(0, floor((burst * window - a) / window))
  reset[i] = 0
  if a > 0 then                                                    -- one more fits when the schedule is that much nearer
    reset[i] = ceil((a - (burst - remaining[i] - 1) * window) / limits[i])
  end
end
return reply(not full, remaining, reset)
