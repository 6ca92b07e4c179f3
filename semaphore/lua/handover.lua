-- handover.lua: a seat its holder's process gave, in memory, to its own
-- waiter at the head of the line (see handover.go) moves to that waiter
-- on the store: the holder's seat goes, and the waiter holds its own,
-- with a fence of its own. Nobody else can have taken the seat meanwhile:
-- it stayed held under the holder's member.
--
-- The waiter's token either leaves the line, or, when another waiter of
-- the process waits behind (behind.go), stays for that one with its
-- arrival (since): the seat the token asked for is that one's now, and a
-- seat given to the token meanwhile went to it. When the holder's seat
-- was lost before (it lapsed, or was force-released), the waiter has no
-- seat, and learns it lost it.
--
-- KEYS: those of room.lua
-- ARGV, name/value pairs: member, seats (the holder's seat), token,
--   wmember, wttl (the waiter's seat and its lease, ms), since (the
--   arrival, server µs, of the waiter behind that takes the token over;
--   none: the token leaves), capacity, channel, prefix, key, wake (see
--   acquire.lua)
--
-- Reply, name/value pairs: moved (1 when the waiter holds its seat now),
-- held (1 when the holder's seat was still held), now, fence (the
-- waiter's), head and clear (see lineHead), granted, woken.

local a = args()
local now, t = clock()
local seats = tonumber(a.seats or '1')
local s = redis.call('ZSCORE', KEYS[1], a.member)
local held = s ~= false and tonumber(s) > now
if s then unhold(a.member, seats) end
-- The token stays for the waiter behind, or leaves; a token that left
-- already was given a seat meanwhile, under the waiter's member.
local meanwhile = false
if a.since then
  redis.call('ZADD', KEYS[2], 'XX', a.since, a.token)
elseif redis.call('ZREM', KEYS[2], a.token) == 1 then
  redis.call('HDEL', KEYS[3], a.token)
  redis.call('HDEL', KEYS[11], a.token)
else
  meanwhile = redis.call('ZSCORE', KEYS[1], a.wmember)
end
local moved, fence, own, woken = 0, '0', {}, {}
if meanwhile then
  -- It runs on that seat, and the holder's goes on.
  moved = 1
  fence = nextFence(KEYS[9], t, math.max(tonumber(meanwhile) - now, 1))
elseif held then
  moved = 1
  fence = hold(a.wmember, seats, now, t, tonumber(a.wttl))
end
if s and (meanwhile or not held) then own, woken = settle(now, t, tonumber(a.capacity), a, false, true) end
local head, clear = lineHead()
return {'moved', moved, 'held', held and 1 or 0, 'now', now, 'fence', fence, 'head', head, 'clear', clear,
  'granted', own, 'woken', woken, 'arrivals', arrivals}
