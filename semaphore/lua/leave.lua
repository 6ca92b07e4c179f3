-- leave.lua: a token stops waiting in a process (its wait ran out, was
-- cancelled, or its Service closed). how 'drop' takes it out of the room
-- for good (an Acquire's token, which is never parked, placed or aside);
-- 'park' puts it among the parked with its arrival
-- (a task that stood by goes back to its queue, keeping its place). The
-- place it held, if any, goes to the next token.
--
-- A seat given to the token before it left (its message may still be on
-- its way) is given back here, and passed on.
--
-- KEYS: those of room.lua
-- ARGV, name/value pairs: token, member (of the seat it waited for), seats
--   (its weight), how,
--   capacity, channel, prefix, key, wake, keyttl (see acquire.lua)
--
-- Reply, name/value pairs: returned (1 when the token's seat was given
-- back), granted (tokens of the caller's channel given a seat), woken
-- (tokens let out).

local a = args()
local now, t = clock()
local token = a.token
local waited = redis.call('ZSCORE', KEYS[2], token)
local returned = 0
if not waited then returned = unhold(a.member, tonumber(a.seats or '1')) end
local known = false -- somebody is known to wait still
if a.how == 'park' then
  local arrival, _, placed = arrivalOf(token, micros(t))
  park(token, arrival, false, placed and arrival or '')
  redis.call('PEXPIRE', KEYS[5], a.keyttl or defaultKeyTTL)
  known = true
elseif waited then
  -- An Acquire's token ('drop') only ever waits in a process: it leaves
  -- the waiting, its slots entry and a fair key's note of it. An empty
  -- room keeps no key.
  redis.call('ZREM', KEYS[2], token)
  redis.call('HDEL', KEYS[3], token)
  redis.call('HDEL', KEYS[11], token)
  known = occupied()
  if not known then dropRoom() end
elseif redis.call('EXISTS', KEYS[5], KEYS[6], KEYS[8]) > 0 then
  -- Its seat came as it left (given back above).
  forget(token)
end
local capacity = tonumber(a.capacity)
if capacity < 0 then capacity = roomCapacity(-1) end
local own, woken = settle(now, t, capacity, a, known)
return {'returned', returned, 'now', now, 'granted', own, 'woken', woken, 'arrivals', arrivals}
