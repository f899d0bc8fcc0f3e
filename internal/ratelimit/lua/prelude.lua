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
  if kind == 119 and v then return v, 1 end                        -- 'w'
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
