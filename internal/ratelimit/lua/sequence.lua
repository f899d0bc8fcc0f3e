-- sequence.lua: steps of different kinds decided one after another in one call, stopping after
-- the first that refuses: a PIX asks its look-up buckets (token_bucket), then decides its own
-- limit (sliding_log, say), and a payment redeems a voucher, then refunds. A sequence's script is
-- prelude.lua and members.lua, then each body it may run (an algorithm's, the slots', the voucher's: lua/<name>.lua),
-- its functions and its decision wrapped in the function decisions['<name>'], then this loop: each
-- step runs the very decision a lone call of its kind runs, on its own locals, and its reply
-- joins the sequence's.
--
-- ARGV[1]            how many steps
-- then, per step: its body's name, its number of keys, its id, its now ('' for the Redis
--                    clock), its operation (prelude.lua's operation: a withdrawal only of a slot, whose reply is a decision's), and
--                    per key: limit, window in ms, burst
-- KEYS               every step's keys, in order
--
-- Steps that read the Redis clock read it once: they decide at one instant. Returns the replies
-- of the steps that ran, one after another in one flat list; a step after a refusal does not
-- run (Go counts the replies).

local count = tonumber(ARGV[1])
local k, pos = 0, 2
for _ = 1, count do
  local decide = decisions[ARGV[pos]] or error('no body ' .. ARGV[pos] .. ' in this sequence')
  n, id = tonumber(ARGV[pos + 1]), ARGV[pos + 2]
  now = member_now(ARGV[pos + 3])
  undo_at, cost, max_wait = operation(ARGV[pos + 4])
  keys, limits, windows, bursts = {}, {}, {}, {}
  for i = 1, n do
    local a = pos + 2 + 3 * i
    keys[i], limits[i], windows[i], bursts[i] = KEYS[k + i], tonumber(ARGV[a]), tonumber(ARGV[a + 1]) * 1000, tonumber(ARGV[a + 2])
  end
  k, pos = k + n, pos + 5 + 3 * n
  local before = o
  decide()
  if out[before + 1] == 0 then break end                           -- refused: the steps after it do not run
end
return out
