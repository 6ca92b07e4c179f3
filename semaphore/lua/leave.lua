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
--   capacity, channel, prefix, key, wake, keyttl (see acquire.lua); only
--   ('1': the token was enrolled by the caller's release and its task
--   never came for it, see enrol in room.lua: the seat given to it goes
--   back, and it parks, with arrival when nothing else of it is known,
--   only while it waits with the enrolled seat, id, or held that seat);
--   how 'transit' (with only) puts a token that waits so back in transit
--   instead (its task went to its queue), and parks one given a seat
--
-- Reply, name/value pairs: returned (1 when the token's seat was given
-- back), granted (tokens of the caller's channel given a seat), woken
-- (tokens let out).

local a = args()
local now, t = clock()
local token = a.token
local waited = redis.call('ZSCORE', KEYS[2], token)
local returned = 0
local others = false -- only: the token is not the caller's (any more)
if a.only == '1' then
  -- A seat given to it goes back, whoever took the token up since: a
  -- task that entered with it (its slot names another seat than the
  -- enrolled one, id), or another way out of the waiting than that seat.
  returned = unhold(a.member, 1)
  if waited then
    local mine = a.channel .. '\t' .. a.id .. '\t'
    others = string.sub(redis.call('HGET', KEYS[3], token) or '', 1, #mine) ~= mine
  else
    others = returned == 0
  end
elseif not waited then
  returned = unhold(a.member, tonumber(a.seats or '1'))
end
local known = false -- somebody is known to wait still
if others then
  -- (The seat given back, if any, is passed on below.)
elseif a.how == 'transit' and waited then
  -- Its task went to its queue, for any worker: it is in transit again,
  -- its place waiting the room's transit for it (see Service.Unenrol).
  redis.call('ZREM', KEYS[2], token)
  redis.call('HDEL', KEYS[3], token)
  redis.call('ZADD', KEYS[6], 'XX', now + tonumber(roomSettings()[3] or '1000'), placeMember(token, a.arrival))
  known = true
elseif a.how == 'park' or a.how == 'transit' then
  local arrival, new, placed = arrivalOf(token, micros(t))
  if new and a.arrival then arrival = a.arrival end
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
