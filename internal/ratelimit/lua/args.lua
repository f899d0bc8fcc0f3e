-- args.lua: one decision's arguments, for a script that decides one request (each algorithm's
-- script: prelude.lua, this, then the algorithm). The replicas send the same arguments a person
-- types, and more after them; what is left out takes its default.
--
-- KEYS         the keys: the request is admitted only if every one has room
-- ARGV[1]      LIMIT: requests per window of KEYS[1] (and of every key not given its own below)
-- ARGV[2]      WINDOW_MS: its window, in milliseconds
-- ARGV[3]      ID: the request's id, which the sorted sets record (default: the time decided, µs);
--              unique per request: an id recorded already is not recorded twice (the sorted sets)
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
