-- args.lua: one decision's arguments, for a script that decides one request (algorithm.go puts
-- it between prelude.lua and the algorithm's body).
--
-- KEYS         the keys
-- ARGV[1]      id
-- ARGV[2]      now in microseconds, or '' to read the Redis clock (tests inject time; never production)
-- ARGV[3]      the operation (prelude.lua's operation): '' decide, 'a' ask, 'c<n>' charge,
--              'r<n>' refund, 'w<at>' withdraw
-- ARGV[3i+1]   limit of KEYS[i]
-- ARGV[3i+2]   window of KEYS[i] in microseconds
-- ARGV[3i+3]   burst of KEYS[i]

id, now = ARGV[1], tonumber(ARGV[2]) or clock()
undo_at, cost, max_wait = operation(ARGV[3])
keys, n = KEYS, #KEYS
limits, windows, bursts = {}, {}, {}
for i = 1, n do
  limits[i], windows[i], bursts[i] = tonumber(ARGV[3 * i + 1]), tonumber(ARGV[3 * i + 2]), tonumber(ARGV[3 * i + 3])
end

-- the algorithm follows
