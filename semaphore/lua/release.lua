-- release.lua: give a seat back, then give the free seats to the tokens
-- waiting in a process and let parked tokens out for the places and seats
-- left (settle, room.lua).
--
-- KEYS: those of room.lua
-- ARGV, name/value pairs: member (the seat), seats (its weight), capacity,
--   channel, prefix, key (see acquire.lua), wake ('1': the caller brings
--   tokens let out back), busy ('1': the caller found tokens in the
--   key's room lately), head ('1': the caller has waiters of the key: the reply says
--   the line's head, see lineHead); for a process's spare seats (see
--   spare.go): spare '1', and keep, the seats it keeps (the others go
--   back; 0 or none: all); settleown ('1': the caller's waiters start as
--   their seat comes), with the room's budget, transit and keyttl, and
--   fair ('1': the key's tokens have notes of their real arrival);
--   nolapse ('1': the seat's lease is surely live, and the caller's
--   process rechecks the key at a lease expiry still to come, so that no
--   lease lapsed: see earliestArmed); enrol ('1': the tokens let out in
--   the places of the caller's waiters given a seat join the waiting as
--   the caller's, see enrol in room.lua), with enrolid (their permit ids'
--   stem) and ttl (their seats' lease ms); handing (how many of the
--   caller's tokens move to a seat it handed in memory) and h1, h2, ...
--   (those tokens, which grant passes over: see handing in room.lua)
--
-- Reply, name/value pairs: held (1 when the seat was still held, 0 when it
-- was already lost), granted (tokens of the caller's channel given a seat),
-- settled (those of them whose standby place went on), later (the tokens
-- let out in their places, for them to bring back as they start),
-- enrolled (those of them that joined the waiting: token, permit id, seat
-- member, arrival, ...), woken (tokens let out), next (the tokens first
-- in line now, when the call saw them for free: see nextInLine), and with head
-- '1', head and clear.

local a = args()
local now, t = clock()
noteHanding(a)
-- Lapsed leases go first: the seat is still held when it is among the
-- rest (its lease had not run out). A caller that knows none lapsed
-- (nolapse) saves the command.
if a.nolapse == '1' then sweptAt = now else sweepHolders(now) end
local seats, keep = tonumber(a.seats or '1'), tonumber(a.keep or '0')
local held = 0
if keep > 0 then
  if redis.call('ZSCORE', KEYS[1], a.member) then held = 1 end
  local rem = {'ZREM', KEYS[1]}
  for i = keep + 1, seats do rem[#rem + 1] = extraSeat(a.member, i) end
  if #rem > 2 then redis.call(unpack(rem)) end
else
  held = unhold(a.member, seats)
  if a.spare == '1' then redis.call('HDEL', KEYS[12], a.member) end
end
-- A caller that found tokens in the key's room lately (busy '1': one of its
-- tasks stood by or parked) does not ask whether anybody waits.
if a.budget then roomGiven(a) end
local own, woken, seated = settle(now, t, tonumber(a.capacity), a, a.busy == '1', true)
-- The tasks of the caller's process given a seat start as they get it
-- (settleown '1', see WithStartOnSeat): their standby places go on now, as
-- settle.lua would once they start, one call less a task. The tokens let
-- out in their places (later) are brought to a slot only once those tasks
-- leave theirs (their Entry's Settle), so that a task given its seat and
-- not started yet never stands beside the next in the budget. A seat sent
-- to another process leaves its place to that process's settle.lua.
local settled, later = {}, {}
if a.settleown == '1' then
  for i = 1, #own, 3 do
    if unplace(own[i], grantedPlace[own[i]]) then
      forgetNotes(own[i], true, a.fair ~= '1')
      settled[#settled + 1] = own[i]
    end
  end
  if #settled > 0 then
    -- A caller that enrols the tokens it lets out (enrol '1', with
    -- enrolid and ttl: see Room.Enrol) makes them its waiters here.
    enrolling = a.enrol == '1'
    later = passOnPlaces(now, a.wake, true)
    enrolling = false
  end
end
if not seated and redis.call('EXISTS', KEYS[1]) == 0 then
  -- The last seat is back: the key idles, and its keys go with it (the
  -- next fence takes the server's clock for its floor, see nextFence).
  redis.call('DEL', KEYS[9])
end
local reply = {'held', held, 'now', now, 'granted', own, 'settled', settled, 'later', later, 'enrolled', enrolled, 'woken', woken, 'arrivals', arrivals,
  'next', nextInLine(lineNext)}
if a.head == '1' then
  local head, clear = lineHead()
  reply[#reply + 1], reply[#reply + 2], reply[#reply + 3], reply[#reply + 4] = 'head', head, 'clear', clear
end
return reply
