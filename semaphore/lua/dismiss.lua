-- dismiss.lua: take a token out of the waiting room for good (see
-- room.lua): its task no longer waits (it ran, or was deleted), or is
-- nowhere to be found. Its standby place goes to the next token.
--
-- KEYS: those of room.lua
-- ARGV, name/value pairs: token, wake, channel, prefix, key
--
-- Reply, name/value pairs: granted, woken (see acquire.lua).

local a = args()
local now, t = clock()
forget(a.token)
local own, woken = settle(now, t, roomCapacity(-1), a)
return {'now', now, 'granted', own, 'woken', woken, 'arrivals', arrivals}
