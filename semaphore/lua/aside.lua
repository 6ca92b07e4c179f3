-- aside.lua: a token steps aside (see stepAside in room.lua): its task
-- waits elsewhere for a while (for another cap's seat, or in a paused
-- queue), so it holds no place here, but keeps its arrival for when it
-- comes back. The place it held goes to the next token.
--
-- KEYS[1..8] holders, queue, qexp, parked, standby, since, room, aside
-- ARGV[1] token
-- ARGV[2] '1' when this Service hands admitted tokens on (it has OnWake)
--
-- Reply: the tokens admitted (a list).

local now, t = clock()
stepAside(ARGV[1], micros(t))
if ARGV[2] ~= '1' then return {} end
return admit(now, math.max(roomCapacity(0) - liveHolders(now), 0))
