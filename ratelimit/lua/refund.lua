-- refund.lua: give back tokens taken for work that then did not run
-- (another of a task's rate limits had none, or a task let out with its
-- tokens paid never came for them): the TAT moves back by cost emission
-- intervals. A TAT that falls to the server's now or before means a full
-- burst: the key is deleted, as redis_rate leaves an idle key.
--
-- ARGV, name/value pairs: interval, cost (see take.lua), token (a paid
--   token whose tokens go back; '' for none)
--
-- Reply, name/value pairs: refunded (1 when tokens went back).

local a = args()
local now = clock()
if (a.token or '') ~= '' and redis.call('ZREM', KEYS[3], a.token) == 0 then
  return {'refunded', 0} -- its task came and took them, or they lapsed
end
local tat = redis.call('GET', KEYS[1])
if not tat then return {'refunded', 0} end
local back = tonumber(tat) - tonumber(a.interval) * tonumber(a.cost)
if back <= now then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], back, 'EX', math.ceil(back - now))
end
return {'refunded', 1}
