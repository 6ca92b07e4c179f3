-- admit.lua: the sweep. Seats and places that freed without a call that
-- would have passed them on (a lease that ran out, a worker that died, a
-- task that never came for its place), or that a new capacity opens, go
-- on: free seats to the tokens waiting in a process, places to the parked
-- (settle, room.lua). With an audit interval, one call a room and
-- three quarters of it, fleet-wide, does that: the others (every worker
-- sweeps the rooms it knows) find it done and return after three
-- commands (an empty room's sweep: one). Once an interval, that call is
-- also handed the parked tokens, for its caller to check that their
-- tasks still wait (a task deleted while it waited leaves its token
-- behind) and dismiss the others. Without one (audit '0'), every call
-- sweeps.
--
-- KEYS: those of room.lua
-- ARGV, name/value pairs: capacity (in force; 0: paused), budget, transit,
--   keyttl, wake, channel, prefix, key (see acquire.lua), audit (the
--   audit interval, ms; '0': none), auditmax (the most parked tokens one
--   audit is handed)
--
-- Reply, name/value pairs: granted, woken (see acquire.lua), audit (the
-- tokens to check), and elsewhere '1' when another call swept the room
-- lately and this one did nothing.

local a = args()
-- A room nobody waits in is left at once (the sweep of an idle fleet's
-- rooms: one command), before the clock is read.
if not occupied() then return {'granted', {}, 'woken', {}, 'audit', {}} end
local now, t = clock()
local audit = {}
local every = tonumber(a.audit)
if every > 0 then
  -- sweptat: the next sweep is due (three quarters of the interval on, so
  -- that a process sweeping once an interval is not put off by the jitter
  -- of its calls); auditat: the next audit.
  local at = redis.call('HMGET', KEYS[7], 'sweptat', 'auditat')
  if tonumber(at[1] or '0') > now then return {'granted', {}, 'woken', {}, 'audit', {}, 'elsewhere', '1'} end
  local set = {'HSET', KEYS[7], 'sweptat', now + math.floor(every * 3 / 4)}
  if tonumber(at[2] or '0') <= now then
    set[#set + 1], set[#set + 2] = 'auditat', now + every
    audit = redis.call('ZRANGE', KEYS[5], 0, tonumber(a.auditmax) - 1)
  end
  redis.call(unpack(set))
end
noteRoom(a, now)
local own, woken = settle(now, t, tonumber(a.capacity), a)
return {'now', now, 'granted', own, 'woken', woken, 'arrivals', arrivals, 'audit', audit}
