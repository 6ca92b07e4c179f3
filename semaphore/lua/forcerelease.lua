-- forcerelease.lua: free every seat of a semaphore, then pass the seats on
-- to the tokens waiting in a process and the places to the parked (settle,
-- room.lua).
--
-- KEYS: those of room.lua
-- ARGV, name/value pairs: capacity ('-1': the room's, else nobody waits in
--   a process), channel, prefix, key, wake
--
-- Reply, name/value pairs: displaced (live holders displaced, whatever
-- their weight), granted,
-- woken (see acquire.lua).

local a = args()
local now, t = clock()
local live = 0
for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')) do
  if not string.find(string.match(m, '^[^\n]*'), '\1', 1, true) then live = live + 1 end
end
redis.call('DEL', KEYS[1])
recallSpares(a.prefix or '', a.key or '') -- their seats went with the rest
local capacity = tonumber(a.capacity)
if capacity < 0 then capacity = roomCapacity(-1) end
local own, woken = settle(now, t, capacity, a)
return {'displaced', live, 'now', now, 'granted', own, 'woken', woken, 'arrivals', arrivals}
