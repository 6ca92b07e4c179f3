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
-- A task standing by (task '1'; see handover.go) takes the seat only while
-- its token still waits in line, or holds the seat a call gave it
-- meanwhile; its standby place goes on with the seat, and the next parked
-- token is let out in it (later), as release.lua's settleown does, and
-- enrolled with enrol '1'. Its fair notes need no forgetting: it has none.
--
-- KEYS: those of room.lua
-- ARGV, name/value pairs: member, seats (the holder's seat), token,
--   wmember, wttl (the waiter's seat and its lease, ms), since (the
--   arrival, server µs, of the waiter behind that takes the token over;
--   none: the token leaves), capacity, channel, prefix, key, wake (see
--   acquire.lua), live ('1': the holder's lease is surely live, see
--   release.lua's nolapse); for a task: task '1', place (the arrival its standby
--   place was made with), the room's budget, hold, transit and keyttl,
--   enrol, enrolid, ttl, and handing, h1, h2, ... (see release.lua)
--
-- Reply, name/value pairs: moved (1 when the waiter holds its seat now),
-- held (1 when the holder's seat was still held), now, fence (the
-- waiter's), head and clear (see lineHead), granted, woken; for a task,
-- settled (1 when its place went on), later, enrolled (see release.lua),
-- inline (1 when its token still waited in line: no other call gave it a
-- seat) and next (see nextInLine) in place of head and clear.

local a = args()
local now, t = clock()
local task = a.task == '1'
if task then roomGiven(a) end
noteHanding(a)
local seats = tonumber(a.seats or '1')
local s, held
if a.live == '1' then
  -- The caller knows the lease is live (see release.lua's nolapse): the
  -- seat is held when it is there.
  held = unhold(a.member, seats) == 1
  s = held
else
  s = redis.call('ZSCORE', KEYS[1], a.member)
  held = s ~= false and tonumber(s) > now
  if s then unhold(a.member, seats) end
end
-- The token stays for the waiter behind, or leaves; a token that left
-- already was given a seat meanwhile, under the waiter's member.
local meanwhile, inline = false, true
if a.since then
  redis.call('ZADD', KEYS[2], 'XX', a.since, a.token)
elseif redis.call('ZREM', KEYS[2], a.token) == 1 then
  redis.call('HDEL', KEYS[3], a.token)
  if not task then redis.call('HDEL', KEYS[11], a.token) end
else
  inline = false
  meanwhile = redis.call('ZSCORE', KEYS[1], a.wmember)
end
local moved, fence, own, woken = 0, '0', {}, {}
if meanwhile then
  -- It runs on that seat, and the holder's goes on.
  moved = 1
  fence = nextFence(KEYS[9], t, math.max(tonumber(meanwhile) - now, 1))
elseif held and (inline or not task) then
  moved = 1
  fence = hold(a.wmember, seats, now, t, tonumber(a.wttl))
end
if s and (meanwhile or moved == 0) then own, woken = settle(now, t, tonumber(a.capacity), a, false, true) end
if not task then
  local head, clear = lineHead()
  return {'moved', moved, 'held', held and 1 or 0, 'now', now, 'fence', fence, 'head', head, 'clear', clear,
    'granted', own, 'woken', woken, 'arrivals', arrivals}
end
-- The line as it stands, for the reply's next; a line that holds tokens
-- has its keys with their TTL (see enrol).
local line = redis.call('ZRANGE', KEYS[2], 0, lineLook - 1, 'WITHSCORES')
lineLeft = lineLeft or #line > 0
local settled, later = 0, {}
if moved == 1 then
  if unplace(a.token, a.place) then
    settled = 1
    enrolling = a.enrol == '1'
    later = passOnPlaces(now, a.wake, true)
    enrolling = false
  end
end
return {'moved', moved, 'held', held and 1 or 0, 'now', now, 'fence', fence, 'granted', own, 'woken', woken,
  'arrivals', arrivals, 'settled', settled, 'later', later, 'enrolled', enrolled, 'inline', inline and 1 or 0,
  'next', nextInLine(line)}
