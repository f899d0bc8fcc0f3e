-- token_bucket.lua: a token bucket with continuous refill, over one or more keys, decided
-- atomically.
-- (prelude.lua, put before it, holds one decision's clock, arguments and reply.)
--
-- A bucket holds up to `burst` tokens and gains `limit` tokens per `window`, continuously; a
-- request takes one token or is refused. Tokens are kept multiplied by the window in
-- microseconds (a "scaled" token is 1/window of a token), so the refill of `limit` scaled units
-- per microsecond is exact integer arithmetic. Each key holds "<scaled tokens>:<time of that
-- count, µs>"; a full bucket needs no key at all: the key lives exactly until the bucket would be
-- full again. remaining_i is the whole tokens left; reset_i the time until there is one more.

-- A request may cost other than one token (the operation 'c<n>', charge): it is admitted while the bucket
-- holds at least one token, as any request, and then takes its whole cost at once, even into
-- debt; the bucket refuses until the refill has paid the debt back. A cost of 0 asks whether a
-- request would be admitted. That is how a request whose price is known only once it has done
-- its work (a PIX key look-up: 1 if found, 20 if not) pays it: admission and payment in one
-- atomic step before it answers, so requests sent together buy no more answers than one by one.
--
-- A negative cost (the operation 'r<k>', refund) gives k tokens back, never above the capacity, and is never refused:
-- a refund (RefundStep), such as the token a PIX payment returns to the look-up bucket that
-- preceded it.
--
-- level(i) is keys[i]'s scaled tokens now, refilled since they were stored, and the time they
-- count from: now, or the later time they were stored at if the clock has stepped back since, so
-- that no span is refilled twice. An absent key is full.
local function level(i)
  local capacity = bursts[i] * windows[i]                          -- a full bucket, scaled
  local v = redis.call('GET', keys[i])
  if not v then return capacity, now end
  local tokens, at = string.match(v, '^(-?%d+):(%d+)$')          -- negative: in debt after a charge
  tokens, at = tonumber(tokens), tonumber(at)
  local elapsed = now - at
  if elapsed < 0 then
    return tokens, at                                              -- the clock stepped back: nothing refilled yet
  elseif elapsed >= (capacity - tokens) / limits[i] then
    return capacity, now                                           -- refilled to the brim (and no overflow)
  end
  return tokens + elapsed * limits[i], now                         -- refill since it was stored
end

-- store(i, l, at) keeps level l of keys[i], as of at, until the bucket is full again, or drops a
-- full one.
local function store(i, l, at)
  local capacity = bursts[i] * windows[i]
  if l >= capacity then
    redis.call('DEL', keys[i])                                     -- a full bucket needs no key
  else
    redis.call('SET', keys[i], string.format('%d:%d', l, at),
      'PX', max(1, ceil(((capacity - l) / limits[i] + at - now) / 1000)))
  end
end

---- each decision: what follows runs once per request (what precedes it, once per call)
if undo_at then                                                    -- withdraw: give the token back, now
  for i = 1, n do
    local l, at = level(i)
    store(i, min(bursts[i] * windows[i], l + windows[i]), at)
  end
  return n
end

local levels, ats = {}, {}
local full = false
for i = 1, n do
  levels[i], ats[i] = level(i)
  if levels[i] < windows[i] and cost >= 0 then
    full = true                                                    -- less than one token: refuse the whole request
  end
end

local remaining, reset = {}, {}
for i = 1, n do
  local limit, window, l = limits[i], windows[i], levels[i]
  if cost < 0 then
    l = min(bursts[i] * window, l - cost * window)            -- a refund, up to a full bucket
    store(i, l, ats[i])
  elseif not full and cost > 0 then
    l = l - cost * window                                          -- take the cost; a refusal takes nothing
    store(i, l, ats[i])
  end
  remaining[i] = max(0, floor(l / window))               -- a bucket in debt has none
  reset[i] = 0
  if l < bursts[i] * window then
    reset[i] = ceil(((remaining[i] + 1) * window - l) / limit) + ats[i] - now -- until the next whole token
  end
end
return reply(not full, remaining, reset)
