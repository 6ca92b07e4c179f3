-- admit.lua: the sweep. Seats and places that freed without a call that
-- would have passed them on (a lease that ran out, a worker that died, a
-- task that never came for its place), or that a new capacity opens, go
-- on: free seats to the tokens waiting in a process, places to the parked
-- (settle, room.lua). Once per audit interval, fleet-wide, one call is
-- also handed the parked tokens, for its caller to check that their tasks
-- still wait (a task deleted while it waited leaves its token behind) and
-- dismiss the others.
--
-- KEYS: those of room.lua
-- ARGV, name/value pairs: capacity (in force; 0: paused), budget, transit,
--   keyttl, wake, channel, prefix, key (see acquire.lua), audit (the
--   audit interval, ms; '0': none), auditmax (the most parked tokens one
--   audit is handed)
--
-- Reply, name/value pairs: granted, woken (see acquire.lua), audit (the
-- tokens to check).

local a = args()
local now, t = clock()
if not occupied() then return {'granted', {}, 'woken', {}, 'audit', {}} end
noteRoom(a, now)
local audit = {}
local every = tonumber(a.audit)
if every > 0 and tonumber(redis.call('HGET', KEYS[7], 'auditat') or '0') <= now then
  redis.call('HSET', KEYS[7], 'auditat', now + every)
  audit = redis.call('ZRANGE', KEYS[5], 0, tonumber(a.auditmax) - 1)
end
local own, woken = settle(now, t, tonumber(a.capacity), a)
return {'now', now, 'granted', own, 'woken', woken, 'arrivals', arrivals, 'audit', audit}
