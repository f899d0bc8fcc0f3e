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

---- each decision: what follows runs once per request (what precedes it, once per call)
if undo_at then return 0 end                                       -- nothing to withdraw: a grant is not an admission

local allowed, remaining, reset = true, {}, {}
for i = 1, n do
  expire(i)
  if cost < 0 then
    redis.call('ZADD', keys[i], now, id)
    local held = redis.call('ZCARD', keys[i])
    if held > limits[i] then
      redis.call('ZREMRANGEBYRANK', keys[i], 0, held - limits[i] - 1) -- the oldest beyond the bound
    end
    redis.call('PEXPIRE', keys[i], ceil(windows[i] / 1000))
  elseif cost == 0 then
    allowed = allowed and redis.call('ZCARD', keys[i]) > 0
  else
    allowed = allowed and #redis.call('ZPOPMIN', keys[i]) > 0
  end
  remaining[i], reset[i] = redis.call('ZCARD', keys[i]), 0
end
return reply(allowed, remaining, reset)
