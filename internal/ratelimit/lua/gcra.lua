-- gcra.lua: the generic cell rate algorithm (the leaky bucket as a meter), over one or more keys,
-- decided atomically.
-- (prelude.lua, put before it, holds one decision's clock, arguments and reply.)
--
-- Requests are due one emission interval T = window / limit apart; a client may run ahead of
-- that schedule by up to `burst` intervals. The only state is the theoretical arrival time (TAT),
-- microseconds since the epoch as a float: when the schedule would next be caught up. A request
-- at `now` moves it to max(TAT, now) + T and is admitted if the new TAT is at most burst × T
-- ahead of now. It decides as a token bucket of the same burst and rate does, with one number of
-- state instead of two. remaining_i is how many more requests fit now; reset_i the time until
-- one more does.

-- tat(i) is keys[i]'s schedule, never behind now: an idle schedule restarts now.
local function tat(i)
  return max(now, tonumber(redis.call('GET', keys[i]) or now))
end

-- store(i, t) keeps schedule t of keys[i] until it is caught up, or drops one already caught up.
local function store(i, t)
  if t <= now then
    redis.call('DEL', keys[i])                                     -- caught up: an idle key needs no state
  else
    redis.call('SET', keys[i], string.format('%.17g', t), 'PX', max(1, ceil((t - now) / 1000)))
  end
end

---- each decision: what follows runs once per request (what precedes it, once per call)
if undo_at then                                                    -- withdraw: move the schedule back one interval
  for i = 1, n do
    store(i, tat(i) - windows[i] / limits[i])
  end
  return n
end

local intervals, tats = {}, {}
local full = false
for i = 1, n do
  intervals[i] = windows[i] / limits[i]                            -- T, the emission interval
  tats[i] = tat(i)
  if tats[i] + intervals[i] - now > bursts[i] * intervals[i] then full = true end -- too far ahead: refuse all
end

local remaining, reset = {}, {}
for i = 1, n do
  local interval, burst, t = intervals[i], bursts[i], tats[i]
  if not full and cost > 0 then                                    -- cost 0 only asks (AskStep): it records nothing
    t = t + interval                                               -- admit: the schedule moves one interval
    store(i, t)
  end
  -- How many more fit now: the room left ahead of the schedule, in whole intervals.
  remaining[i] = max(0, floor((burst * interval - (t - now)) / interval))
  reset[i] = 0
  if t > now then                                                  -- one more fits when the schedule is that much nearer
    reset[i] = ceil(t - now - (burst - remaining[i] - 1) * interval)
  end
end
return reply(not full, remaining, reset)
