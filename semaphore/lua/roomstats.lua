-- roomstats.lua: how many tasks wait for a key and since when, read from
-- its waiting room (see room.lua), for monitoring. It writes nothing.
--
-- KEYS: those of room.lua
-- ARGV, name/value pairs: placesmax (the most tokens in places whose
--   arrival is looked up: the oldest wait is the smallest arrival of all)
--
-- Reply, name/value pairs: now (server µs), parked, waiting (tokens
-- waiting in a process: Acquire callers, tasks standing by), places (in
-- use or lapsed), live (places in use, not lapsed), inboth (tokens in
-- places that also wait in a process: tasks standing by in a slot),
-- oldest (the smallest arrival, µs; 0 when nobody waits).

local a = args()
local now, t = clock()
local nowus = tonumber(micros(t))
if not occupied() then return {'now', nowus, 'parked', 0, 'waiting', 0, 'places', 0, 'live', 0, 'inboth', 0, 'oldest', 0} end
local parked = redis.call('ZCARD', KEYS[5])
local waiting = redis.call('ZCARD', KEYS[2])
local places = redis.call('ZCARD', KEYS[6])
local live = redis.call('ZCOUNT', KEYS[6], '(' .. now, '+inf')
local oldest = 0
local function older(s)
  local v = tonumber(s)
  if v and (oldest == 0 or v < oldest) then oldest = v end
end
if parked > 0 then older(redis.call('ZRANGE', KEYS[5], 0, 0, 'WITHSCORES')[2]) end
if waiting > 0 then older(redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')[2]) end
local inboth = 0
if places > 0 then
  local tokens = redis.call('ZRANGE', KEYS[6], 0, tonumber(a.placesmax) - 1)
  for _, arrival in ipairs(redis.call('HMGET', KEYS[7], unpack(tokens))) do older(arrival) end
  if waiting > 0 then
    for _, s in ipairs(redis.call('ZMSCORE', KEYS[2], unpack(tokens))) do
      if s then inboth = inboth + 1 end
    end
  end
end
return {'now', nowus, 'parked', parked, 'waiting', waiting, 'places', places, 'live', live, 'inboth', inboth, 'oldest', oldest}
