-- admit.lua: let tokens out of the waiting room (see room.lua) when places
-- or seats freed without a call that would have done it (a lease that ran
-- out, a worker that died, a task deleted on its way), or a new capacity
-- opens some. The worker calls it every second for the keys it knows, and
-- when a capacity changes. Once per audit interval, fleet-wide, one call
-- is also handed the tokens parked in the room, for its caller to check
-- that their tasks still wait (a task deleted while it waited leaves its
-- token behind) and dismiss the others.
--
-- KEYS[1..8] holders, queue, qexp, parked, standby, since, room, aside
-- ARGV[1] capacity in force (0: paused)
-- ARGV[2] standby budget
-- ARGV[3] transit: how long a place waits for its task, ms
-- ARGV[4] how long the room's keys outlive their last use, ms
-- ARGV[5] '1' when this Service hands admitted tokens on (it has OnWake)
-- ARGV[6] the audit interval, ms ('0': no audit)
-- ARGV[7] the most parked tokens one audit is handed
--
-- Reply: {the tokens admitted (a list), the tokens to audit (a list)}

local now = clock()
if redis.call('EXISTS', KEYS[4], KEYS[5]) == 0 then return {{}, {}} end
redis.call('HSET', KEYS[7], 'capacity', ARGV[1], 'budget', ARGV[2], 'transit', ARGV[3], 'keyttl', ARGV[4])
redis.call('PEXPIRE', KEYS[7], ARGV[4])
local audit = {}
local every = tonumber(ARGV[6])
if every > 0 and tonumber(redis.call('HGET', KEYS[7], 'auditat') or '0') <= now then
  redis.call('HSET', KEYS[7], 'auditat', now + every)
  audit = redis.call('ZRANGE', KEYS[4], 0, tonumber(ARGV[7]) - 1)
end
if ARGV[5] ~= '1' then return {{}, audit} end
return {admit(now, math.max(tonumber(ARGV[1]) - liveHolders(now), 0)), audit}
