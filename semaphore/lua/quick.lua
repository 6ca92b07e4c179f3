-- quick.lua (after nextfence.lua): a seat taken and given back on a key nobody waits for,
-- without the waiting room's functions (room.lua). It answers 'room' and
-- changes nothing when anybody waits (or, for a take that finds the key
-- full, when processes hold spare seats of it that must be recalled): the
-- caller then asks acquire.lua or release.lua, which do everything.
--
-- KEYS[1] holders  ZSET member -> lease expiry (server ms), as in room.lua
-- KEYS[2] waiting, KEYS[3] parked, KEYS[4] places, KEYS[5] aside: the
--                  room (room.lua)
-- KEYS[6] fence    STRING: the last fence granted (nextfence.lua)
-- KEYS[7] spares   HASH: the processes' spare seats of the key (room.lua)
--
-- ARGV[1] 'take': ARGV[2] member (permit id, or id "\n" label), ARGV[3]
--         lease ms, ARGV[4] capacity. One seat.
--         Reply: {'seat', now ms, fence, seats left free} | {'full', now ms}
--         | {'room'}
-- ARGV[1] 'give': ARGV[2] member (one seat) whose lease may have run out
--         (a seat surely live goes back with plain commands: see
--         quickGive). Reply: {'held' | 'lost'} | {'room'}
--
-- A take drops lapsed leases only when the live and lapsed ones together
-- leave no seat free: a lapsed lease still counted never lets a take
-- past the capacity, and a key with seats to spare needs no sweep (the
-- monitoring counts live leases by their expiry, holders.lua).

if redis.call('EXISTS', KEYS[2], KEYS[3], KEYS[4], KEYS[5]) > 0 then return {'room'} end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

if ARGV[1] == 'give' then
  local s = redis.call('ZSCORE', KEYS[1], ARGV[2])
  if not s then return {'lost'} end
  redis.call('ZREM', KEYS[1], ARGV[2])
  if redis.call('EXISTS', KEYS[1]) == 0 then redis.call('DEL', KEYS[6]) end
  if tonumber(s) > now then return {'held'} end
  return {'lost'}
end

local ttl = tonumber(ARGV[3])
local capacity = tonumber(ARGV[4])
local held = redis.call('ZCARD', KEYS[1])
if held >= capacity then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  held = redis.call('ZCARD', KEYS[1])
end
local free = capacity - held
if free <= 0 then
  if redis.call('EXISTS', KEYS[7]) == 1 then return {'room'} end
  return {'full', now}
end
redis.call('ZADD', KEYS[1], now + ttl, ARGV[2])
if redis.call('PTTL', KEYS[1]) < ttl then redis.call('PEXPIRE', KEYS[1], ttl * 2) end
return {'seat', now, nextFence(KEYS[6], t, ttl), free - 1}
