-- gcra.lua: the generic cell rate algorithm (the leaky bucket as a meter), over one or more keys,
-- decided atomically.
--
-- Requests are due one emission interval T = window / limit apart; a client may run ahead of
-- that schedule by up to `burst` intervals. The only state is the theoretical arrival time (TAT):
-- when the schedule would next be caught up. A request at `now` moves it to max(TAT, now) + T and
-- is admitted if the new TAT is at most burst × T ahead of now. It decides as a token bucket of
-- the same burst and rate does, with one number of state instead of two.
--
-- KEYS[i]      the TAT of the i-th identity, microseconds since the epoch, as a float
-- ARGV[1]      this request's id: unused (GCRA cannot tell a retry from a new request)
-- ARGV[2]      now in microseconds, or '' to read the Redis clock (tests inject time)
-- ARGV[3i]     limit: requests per window; ARGV[3i+1] window in microseconds; ARGV[3i+2] burst
--
-- Returns {allowed, remaining_1, reset_1, ..., now}: remaining_i is how many more requests fit now;
-- reset_i the time in microseconds until one more does (0 when the key is idle).

local now = tonumber(ARGV[2])
if now == nil then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end

local n = #KEYS
local intervals, bursts, tats = {}, {}, {}
local full = false
for i = 1, n do
  local limit, window, burst = tonumber(ARGV[3 * i]), tonumber(ARGV[3 * i + 1]), tonumber(ARGV[3 * i + 2])
  local interval = window / limit                                  -- T, the emission interval
  local tat = tonumber(redis.call('GET', KEYS[i]) or now)
  if tat < now then tat = now end                                  -- an idle schedule restarts now
  if tat + interval - now > burst * interval then full = true end -- too far ahead: refuse the whole request
  intervals[i], bursts[i], tats[i] = interval, burst, tat
end

local out = {full and 0 or 1}
for i = 1, n do
  local interval, burst, tat = intervals[i], bursts[i], tats[i]
  if not full then
    tat = tat + interval                                           -- admit: the schedule moves one interval
    redis.call('SET', KEYS[i], string.format('%.17g', tat),
      'PX', math.max(1, math.ceil((tat - now) / 1000)))            -- gone once the schedule is caught up
  end
  -- How many more fit now: the room left ahead of the schedule, in whole intervals.
  local remaining = math.floor((burst * interval - (tat - now)) / interval)
  if remaining < 0 then remaining = 0 end
  local reset = 0
  if tat > now then                                                -- one more fits when the schedule is that much nearer
    reset = math.ceil(tat - now - (burst - remaining - 1) * interval)
  end
  out[2 * i] = remaining
  out[2 * i + 1] = reset
end
out[#out + 1] = now                                                -- the time decided, for undo.lua
return out
