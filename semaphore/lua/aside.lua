-- aside.lua: a token steps aside (see stepAside in room.lua): its task
-- waits elsewhere for a while (for another cap's seat, or in a paused
-- queue), so it holds no place here, but keeps its arrival for when it
-- comes back. The place it held goes to the next token.
--
-- KEYS: those of room.lua
-- ARGV, name/value pairs: token, wake, channel, prefix, key
--
-- Reply, name/value pairs: granted, woken (see acquire.lua).

local a = args()
local now, t = clock()
local capacity = roomCapacity(-1)
stepAside(a.token, micros(t))
recallSpares(a.prefix or '', a.key or '')
local own, woken = settle(now, t, capacity, a)
return {'now', now, 'granted', own, 'woken', woken, 'arrivals', arrivals}
