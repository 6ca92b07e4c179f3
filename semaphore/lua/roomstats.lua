-- roomstats.lua: how many tasks wait for a key and since when, read from
-- its waiting room (see room.lua), for monitoring. It writes nothing: a
-- standby place that lapsed stays where it is until a script that admits
-- moves it back among the parked, with its arrival.
--
-- KEYS[1..7] holders, queue, qexp (unused), parked, standby, since, room
-- ARGV[1] the most standby tokens whose arrival is looked up (the oldest
--         wait is the smallest arrival among the parked and those)
--
-- Reply: {now (server µs), parked tokens, standby tokens (places in use or
--         lapsed), standby places in use (not lapsed), the smallest
--         arrival (server µs; 0 when nobody waits)}

local now, t = clock()
local nowus = tonumber(micros(t))
if not occupied() then return {nowus, 0, 0, 0, 0} end
local parked = redis.call('ZCARD', KEYS[4])
local standing = redis.call('ZCARD', KEYS[5])
local live = redis.call('ZCOUNT', KEYS[5], '(' .. now, '+inf')
local oldest = 0
if parked > 0 then
  oldest = tonumber(redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')[2])
end
if standing > 0 then
  local tokens = redis.call('ZRANGE', KEYS[5], 0, tonumber(ARGV[1]) - 1)
  for _, arrival in ipairs(redis.call('HMGET', KEYS[6], unpack(tokens))) do
    local a = tonumber(arrival)
    if a and (oldest == 0 or a < oldest) then oldest = a end
  end
end
return {nowus, parked, standing, live, oldest}
