-- forcerelease.lua: free every seat of a semaphore, then pass the seats on
-- to the tokens waiting in a process and the places to the parked (settle,
-- room.lua).
--
-- KEYS: those of room.lua
-- ARGV, name/value pairs: capacity ('-1': the room's, else nobody waits in
--   a process), channel, prefix, key, wake
--
-- Reply, name/value pairs: displaced (live holders displaced), granted,
-- woken (see acquire.lua).

local a = args()
local now, t = clock()
local live = redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')
redis.call('DEL', KEYS[1])
local capacity = tonumber(a.capacity)
if capacity < 0 then capacity = roomCapacity(-1) end
local own, woken = settle(now, t, capacity, a)
return {'displaced', live, 'now', now, 'granted', own, 'woken', woken}
