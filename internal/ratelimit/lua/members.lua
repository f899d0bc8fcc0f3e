-- members.lua: what a script that decides several requests in one call (batch.lua, sequence.lua)
-- adds to prelude.lua.

-- member_now is the now of one decision of several in a call (batch.lua, sequence.lua): its own
-- injected time, or the Redis clock, read once per call, so that they decide at one instant, as
-- the same requests sent one by one within a microsecond would.
local call_now
local function member_now(arg)
  local t = tonumber(arg)
  if t then return t end
  call_now = call_now or clock()
  return call_now
end

