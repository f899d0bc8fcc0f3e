-- leaky_bucket.lua: the leaky bucket as a queue, over one key, decided atomically.
-- (prelude.lua, put before it, holds one decision's clock, arguments and reply.)
--
-- The meters (the other six) answer at once: admitted or refused. The queue also answers at
-- once, but an admission may be a turn later: requests leave one every pace T = window / limit,
-- and at most `places` (the burst argument: Policy.Queue) wait for theirs. A request that finds
-- a place is given its turn, max(now, last turn + T), and its replica holds it until then
-- (package queue); one that finds every place taken, or whose turn would come later than it can
-- wait (max_wait, from its deadline), is refused, recording nothing.
--
-- The key is a sorted set of places: member = the request's id, score = its turn (µs). Those
-- whose turn has come are served; the newest of them stays until a pace after its turn, since
-- the next turn is counted from it. Each waiter holds a place of its own, so one that leaves
-- (its client went away: the withdrawal, by its id) gives it back, and the turns after it move
-- up, each by the same amount (waiting turns are T apart: a gap can only open before the first);
-- one number of state, as GCRA keeps, would instead book the last turn twice.
--
-- remaining is the free places after this request; reset the time until one more place frees
-- (the first waiter's turn; 0 when none waits); wait, appended to the reply, this request's wait
-- for its turn (0 when served now or refused). A withdrawal returns {removed, turn, moved, now}: 1
-- if the place was there, its turn, how far the turns after it moved up (µs), and when: a turn
-- given after that already counts from the moved queue, and must not move again.

-- at is a time written into a command's argument string ('(' .. x): Lua's tostring keeps 14
-- digits, and a µs clock needs 16 (Redis formats a plain number argument exactly by itself).
local function at(t)
  return string.format('%.17g', t)
end

---- each decision: what follows runs once per request (what precedes it, once per call)
if n ~= 1 then return error('pixlimit: a leaky bucket decides one key at a time') end
local key, T, places = keys[1], windows[1] / limits[1], bursts[1] -- T: the pace, µs

if undo_at then                                                    -- leave: give the place back, move the rest up
  local turn = tonumber(redis.call('ZSCORE', key, id))
  if not turn then return {0, 0, 0, now} end                       -- served or already gone: nothing to give back
  local after = redis.call('ZRANGEBYSCORE', key, '(' .. at(turn), '+inf', 'WITHSCORES')
  redis.call('ZREM', key, id)
  local prev = redis.call('ZREVRANGEBYSCORE', key, '(' .. at(turn), '-inf', 'WITHSCORES', 'LIMIT', 0, 1)[2]
  local first = prev and max(tonumber(prev) + T, now) or now       -- where the next turn may now be
  local moved = 0
  if #after > 0 then
    moved = max(0, tonumber(after[2]) - first)
  end
  if moved > 0 then
    for j = 1, #after, 2 do
      redis.call('ZADD', key, at(tonumber(after[j + 1]) - moved), after[j])
    end
  end
  return {1, ceil(turn), floor(moved), now}                        -- floor: a waiter told to move up is never early
end

redis.call('ZREMRANGEBYSCORE', key, '-inf', at(now - T))               -- served a pace ago or more: no next turn counts from them
local last = redis.call('ZREVRANGE', key, 0, 0, 'WITHSCORES')[2]   -- the latest turn given
local turn = last and max(now, tonumber(last) + T) or now
local waiting = redis.call('ZCOUNT', key, '(' .. at(now), '+inf')      -- the places taken
local room = waiting < places
local fits = not max_wait or turn - now <= max_wait                -- its turn comes before its deadline
local admitted = room and fits
if admitted and cost > 0 then                                      -- cost 0 only asks: it takes no place
  redis.call('ZADD', key, at(turn), id)
  redis.call('PEXPIRE', key, ceil((turn - now + T) / 1000))        -- the last place outlives its turn by a pace
  if turn > now then waiting = waiting + 1 end
end

local reset = 0
local head = redis.call('ZRANGEBYSCORE', key, '(' .. at(now), '+inf', 'WITHSCORES', 'LIMIT', 0, 1)[2]
if head then reset = ceil(tonumber(head) - now) end                -- a place frees at the first waiter's turn
if not admitted and not fits and room then
  reset = ceil(turn - now - max_wait)                              -- the same request fits when its turn is that much nearer
end
local wait = 0
if admitted then wait = ceil(turn - now) end
local remaining = 0
if admitted then remaining = max(0, places - waiting) end          -- refused: no place this request could take
return reply(admitted, {remaining}, {reset}, wait)
