-- voucher.lua: grants that a later request redeems, each once, within a window (a look-up that
-- a payment may turn into a refund, as DICT gives a look-up's token back when it led to a payment).
--
-- KEYS[1]  the grants: a sorted set of members scored by the time each was granted, in µs
-- ARGV[1]  now in µs, or '' for the Redis clock
-- ARGV[2]  the window in µs: a grant older than that can no longer be redeemed
-- ARGV[3]  the most grants the key holds: past it the oldest are dropped, so memory is bounded
-- ARGV[4]  a member to grant (unique per grant), or '' to redeem one
--
-- Replies 1 when it granted, or redeemed a grant (the oldest live one, taken away); 0 when there
-- was none to redeem.
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local window, most = tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)  -- expired grants
if ARGV[4] ~= '' then
  redis.call('ZADD', KEYS[1], now, ARGV[4])
  local n = redis.call('ZCARD', KEYS[1])
  if n > most then
    redis.call('ZREMRANGEBYRANK', KEYS[1], 0, n - most - 1)   -- the oldest beyond the bound
  end
  redis.call('PEXPIRE', KEYS[1], math.ceil(window / 1000))
  return 1
end
local taken = redis.call('ZPOPMIN', KEYS[1])
return #taken > 0 and 1 or 0
