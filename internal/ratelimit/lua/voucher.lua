-- voucher.lua: grants that a later request redeems, each once, within a window (a look-up that
-- a payment may turn into a refund, as DICT gives a look-up's token back when it led to a
-- payment). Not a rate-limit algorithm, but written as their bodies are (prelude.lua's locals,
-- its reply), so that a sequence can redeem a voucher and refund in one call (package sequence).
--
-- keys[i]      the grants: a sorted set of members scored by the time each was granted, in µs
-- limits[i]    the most grants the key holds: past it the oldest are dropped, so memory is bounded
-- windows[i]   the window in µs: a grant older than that can no longer be redeemed
-- cost         1 (decide) redeems a grant, the oldest live one, and is admitted when there was
--              one; 0 (ask) says whether there is one; -1 (the operation 'r1', give) records a
--              grant, named by id, and is always admitted
--
-- remaining_i is how many grants keys[i] holds after the operation; reset_i is 0.

-- expire drops keys[i]'s grants older than its window.
local function expire(i)
  redis.call('ZREMRANGEBYSCORE', keys[i], '-inf', now - windows[i])
end

-- redeem takes keys[i]'s oldest live grant. The oldest of all is live unless it has expired, and
-- then every expired one goes before the next is taken: so a redemption is one call while the
-- oldest grant is live (or there is none), where expiring first would be two. It returns whether
-- it took one, and whether the key held none at all.
local function redeem(i)
  local oldest = redis.call('ZPOPMIN', keys[i])                    -- {grant, granted at}, or {}
  if #oldest == 0 then return false, true end
  if tonumber(oldest[2]) <= now - windows[i] then
    expire(i)
    oldest = redis.call('ZPOPMIN', keys[i])
  end
  return #oldest > 0, false
end

---- each decision: what follows runs once per request (what precedes it, once per call)
if undo_at then return 0 end                                       -- nothing to withdraw: a grant is not an admission
if cost > 0 and n > 1 then                                         -- one key redeemed at a time: all-or-nothing is not kept across keys
  return error('pixlimit: a redemption takes one key')
end

local allowed, remaining, reset = true, {}, {}
for i = 1, n do
  local held                                                       -- the grants keys[i] holds after the operation
  if cost < 0 then
    expire(i)
    redis.call('ZADD', keys[i], now, id)
    held = redis.call('ZCARD', keys[i])
    if held > limits[i] then
      redis.call('ZREMRANGEBYRANK', keys[i], 0, held - limits[i] - 1) -- the oldest beyond the bound
      held = limits[i]
    end
    redis.call('PEXPIRE', keys[i], ceil(windows[i] / 1000))
  elseif cost == 0 then
    expire(i)
    held = redis.call('ZCARD', keys[i])
    allowed = allowed and held > 0
  elseif allowed then                                              -- a refusal by an earlier key redeems nothing here
    local empty
    allowed, empty = redeem(i)
    if empty then held = 0 end
  else
    expire(i)
  end
  remaining[i], reset[i] = held or redis.call('ZCARD', keys[i]), 0
end
return reply(allowed, remaining, reset)
