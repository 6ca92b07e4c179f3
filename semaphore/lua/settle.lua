-- settle.lua: a task that held a standby place took its seat and starts:
-- its token leaves the room (its place goes to the next token, let out in
-- the same call), unless it waits for the key again meanwhile. It frees a
-- place and no seat, so it gives no seat and lets out no token for free
-- seats: the calls that free seats do (release, leave, the sweep).
--
-- KEYS: those of room.lua
-- ARGV, name/value pairs: token, place (the arrival its standby place
--   was made with, see placeMember), wake, channel, prefix, key, fair ('1':
--   the token entered with a share value, so it has a note of its real
--   arrival to forget), and the room's budget, transit and keyttl (see
--   acquire.lua), which the call lets the next token out with; enrol,
--   enrolid, ttl and capacity (see release.lua)
--
-- Reply, name/value pairs: now, granted (always empty), woken (see
-- acquire.lua), enrolled (see release.lua).

local a = args()
local now = clock()
roomGiven(a)
local left = false
if not redis.call('ZSCORE', KEYS[2], a.token) then
  -- It took its seat, which took it out of the waiting and its slots
  -- entry: what is left of it is its place (unless the place lapsed and
  -- put it back among the parked, where it keeps its arrival).
  local placed = unplace(a.token, a.place)
  if placed or not redis.call('ZSCORE', KEYS[5], a.token) then
    forgetNotes(a.token, placed, a.fair ~= '1')
    left = true
  end
end
-- A caller that enrols the tokens it lets out (enrol '1', with enrolid,
-- ttl and capacity: see release.lua) makes them its waiters.
enrolling = a.enrol == '1'
local woken = passOnPlaces(now, a.wake, left)
return {'now', now, 'granted', {}, 'woken', woken, 'arrivals', arrivals, 'enrolled', enrolled}
