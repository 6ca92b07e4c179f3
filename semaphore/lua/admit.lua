-- admit.lua: let tokens out of the waiting room (see room.lua) when places
-- or seats freed without a call that would have done it (a lease that ran
-- out, a worker that died), or a new capacity opens some. The worker calls
-- it now and then for the keys it knows, and when a capacity changes.
--
-- KEYS[1..7] holders, queue, qexp, parked, standby, since, room
-- ARGV[1] capacity in force (0: paused)
-- ARGV[2] standby budget
-- ARGV[3] transit: how long a place waits for its task, ms
-- ARGV[4] how long the room's keys outlive their last use, ms
-- ARGV[5] '1' when this Service hands admitted tokens on (it has OnWake)
--
-- Reply: the tokens admitted (a list).

local now = clock()
if redis.call('EXISTS', KEYS[4], KEYS[5]) == 0 then return {} end
redis.call('HSET', KEYS[7], 'capacity', ARGV[1], 'budget', ARGV[2], 'transit', ARGV[3], 'keyttl', ARGV[4])
redis.call('PEXPIRE', KEYS[7], ARGV[4])
if ARGV[5] ~= '1' then return {} end
return admit(now, math.max(tonumber(ARGV[1]) - liveHolders(now), 0))
