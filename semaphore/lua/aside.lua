-- aside.lua: a token steps aside (see stepAside in room.lua): its task
-- waits elsewhere for a while (for another cap's seat, or in a paused
-- queue), so it holds no place here, but keeps its arrival for when it
-- comes back. The place it held goes to the next token.
--
-- KEYS: those of room.lua
-- ARGV, name/value pairs: token, wake, channel, prefix, key, transit
--   ('1': only a token in transit steps aside; one that waits in a
--   process, its task standing by, or that holds no place stays as it is)
--
-- Reply, name/value pairs: granted, woken (see acquire.lua).

local a = args()
local now, t = clock()
if a.transit == '1' and (redis.call('ZSCORE', KEYS[2], a.token) or not placeOf(a.token)) then
  return {'now', now, 'granted', {}, 'woken', {}, 'arrivals', {}}
end
local capacity = roomCapacity(-1)
stepAside(a.token, micros(t))
recallSpares(a.prefix or '', a.key or '')
local own, woken = settle(now, t, capacity, a)
return {'now', now, 'granted', own, 'woken', woken, 'arrivals', arrivals}
