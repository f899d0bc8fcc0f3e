-- testdata/gcra_float.lua: gcra.lua as replicas ran it before 49c2326 (generated at 91382d3), its
-- TAT a float. Kept to hold the exact script's stored form readable by it (TestGCRARollsForward).
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
--
-- Run it alone on any Redis 7, with the first arguments the replicas send (args.lua, below):
--
--   redis-cli --eval internal/ratelimit/gcra.lua KEY [KEY ...] , LIMIT WINDOW_MS
--
-- reply  {allowed, remaining_1, reset_ms_1, ..., remaining_n, reset_ms_n, now_us, reset_us_1, ...}

-- prelude.lua: what every script that decides shares, whether it decides one request (args.lua
-- reads its arguments: an algorithm's script) or several (batch.lua reads each member's, and
-- sequence.lua each step's). The algorithm's code below finds one decision's state in these
-- locals and its reply in hand. protocol.go is the Go side: one encoder (call) and one decoder
-- (parseReply).
--
-- keys[i]      the state of each identity, in the algorithm's own format
-- id           the request's id: unique per request (the sorted sets record it; the others ignore it)
-- now          the time decided, in microseconds
-- undo_at      nil to decide; or the time (µs, the `now` its decision returned) of the admission
--              to withdraw: the algorithm then undoes it and returns how many keys it took from
-- cost         what the request takes (token_bucket; 0 only asks, below 0 gives back; 1 for the others)
-- max_wait     the longest a request may wait for its turn (leaky_bucket), µs; nil: as long as the queue
--              (undo_at, cost and max_wait are the call's operation, decoded by operation below)
-- n            how many keys
-- limits[i]    requests per window of keys[i], at least 1
-- windows[i]   window of keys[i] in microseconds (a whole number of milliseconds on the wire)
-- bursts[i]    requests at once (the capacity of token_bucket and gcra; a queue's places; the limit for the others)
--
-- A decision returns reply(allowed, remaining, reset) = {allowed, remaining_1, reset_ms_1, ...,
-- now, reset_us_1, ...}: allowed is 1 or 0 for the whole request; remaining_i how many more
-- keys[i] admits now; reset_ms_i the milliseconds, rounded up, until it admits one more than that
-- (0 when it holds nothing), for a person, and reset_us_i the same to the microsecond, for the
-- replicas (a deny cache must not refuse a microsecond too long); now the time decided, µs; the
-- leaky bucket's (a queue's) adds wait, the µs until the request's turn. A withdrawal returns how many keys it took something back from (a queue's, the
-- turns it moved: leaky_bucket.lua).
--
-- An algorithm has two parts, split at the line "---- each decision": its functions, made once
-- per script call, and its decision, run once per request: in a batch or a sequence, once per
-- member, with these locals set to that member's. (The scripts are files made from these parts
-- by scripts_test.go, TestScriptsAreGenerated.)

local id, now, undo_at, cost, max_wait, n, keys, limits, windows, bursts

-- The library functions the bodies use, as locals: a global look-up per use costs more than the
-- arithmetic around it.
local floor, ceil, max, min, byte, char, sub = math.floor, math.ceil, math.max, math.min, string.byte, string.char, string.sub

-- clock is the Redis server's time in µs: the one clock every replica shares.
local function clock()
  local t = redis.call('TIME')                                     -- {seconds, microseconds}
  return t[1] * 1000000 + t[2]                                     -- < 2^53, so exact in a Lua number
end

-- operation decodes a call's operation (protocol.go's op.arg), the one place it is read. It
-- returns undo_at, cost and max_wait:
--   ''       decide one request                      nil, 1
--   'q<µs>'  decide one, whose turn is at most µs away (leaky_bucket)  nil, 1, µs
--   'a'      ask, taking nothing                     nil, 0
--   'c<n>'   charge n tokens (token_bucket)          nil, n
--   'r<n>'   refund (give) n tokens (token_bucket)   nil, -n
--   'w<at>'  withdraw the admission made at `at`     at, 1
local function operation(op)
  if op == '' then return nil, 1 end
  local kind, v = byte(op), tonumber(sub(op, 2))
  if kind == 113 and v and v >= 0 then return nil, 1, v end       -- 'q'
  if kind == 97 then return nil, 0 end                             -- 'a'
  if kind == 99 and v and v >= 1 then return nil, v end            -- 'c'
  if kind == 114 and v and v >= 1 then return nil, -v end          -- 'r'
  if kind == 119 then return v, 1 end                              -- 'w'
  return error('pixlimit: unknown operation ' .. op)
end

-- reply appends a decision's reply to out, the script's reply: a lone call's is its one decision,
-- a batch's its members' one after another.
local out, o = {}, 0
local function reply(allowed, remaining, reset, wait)
  out[o + 1] = allowed and 1 or 0
  for i = 1, n do
    out[o + 2 * i], out[o + 2 * i + 1] = remaining[i], ceil(reset[i] / 1000)
    out[o + 2 * n + 2 + i] = reset[i]                              -- exact, for the replicas: after now
  end
  out[o + 2 * n + 2] = now                                         -- the time decided: a withdrawal names it
  o = o + 3 * n + 2
  if wait then                                                     -- a queue's: the wait for the turn
    out[o + 1] = wait
    o = o + 1
  end
  return out
end
-- args.lua: one decision's arguments, for a script that decides one request (each algorithm's
-- script: prelude.lua, this, then the algorithm). The replicas send the same arguments a person
-- types, and more after them; what is left out takes its default.
--
-- KEYS         the keys: the request is admitted only if every one has room
-- ARGV[1]      LIMIT: requests per window of KEYS[1] (and of every key not given its own below)
-- ARGV[2]      WINDOW_MS: its window, in milliseconds
-- ARGV[3]      ID: the request's id, which the sorted sets record (default: the Redis time, µs)
-- ARGV[4]      BURST: requests at once (token_bucket, gcra; a queue's places; default: LIMIT)
-- ARGV[5]      NOW_US: the time decided, µs ('' or absent: the Redis clock; tests inject time)
-- ARGV[6]      OP: the operation (prelude.lua's operation: '' or absent decides)
-- ARGV[3i+1..] for each key i from the second: its LIMIT, WINDOW_MS and BURST

now = tonumber(ARGV[5]) or clock()
id = ARGV[3]
if id == nil or id == '' then id = string.format('%.0f', now) end
undo_at, cost, max_wait = operation(ARGV[6] or '')
keys, n = KEYS, #KEYS
limits, windows, bursts = {}, {}, {}
for i = 1, n do
  local a = i == 1 and 0 or 3 * i                                  -- key 1: ARGV[1], [2] and [4]; key i: ARGV[3i+1..3i+3]
  local limit = tonumber(ARGV[a + 1])
  if i > 1 and not limit then                                      -- not given its own: the first key's
    limits[i], windows[i], bursts[i] = limits[1], windows[1], bursts[1]
  else
    limits[i], windows[i] = limit, tonumber(ARGV[a + 2]) * 1000
    bursts[i] = tonumber(ARGV[i == 1 and 4 or a + 3]) or limit
  end
end

-- the algorithm follows
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
