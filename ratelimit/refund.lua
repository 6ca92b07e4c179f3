-- refund.lua: give back tokens a take spent, for a task that then did not
-- run (another of its rate limits had none): the key's theoretical arrival
-- time (TAT), as redis_rate keeps it, moves back by cost emission
-- intervals. A TAT that falls to the server's now or before means a full
-- burst: the key is deleted, as redis_rate leaves an idle key.
--
-- KEYS[1] rate:<prefix>{<key>}  STRING: the TAT, float seconds since
--                               2017-01-01 (redis_rate's epoch)
-- ARGV[1] seconds one token takes to earn (period / rate)
-- ARGV[2] cost: tokens to give back
--
-- Reply: 1 when the key held a TAT, else 0.

local tat = redis.call('GET', KEYS[1])
if not tat then return 0 end
local t = redis.call('TIME')
local now = (t[1] - 1483228800) + (t[2] / 1000000)
local back = tonumber(tat) - tonumber(ARGV[1]) * tonumber(ARGV[2])
if back <= now then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], back, 'EX', math.ceil(back - now))
end
return 1
