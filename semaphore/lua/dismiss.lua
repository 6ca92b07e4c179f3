-- dismiss.lua: take a token out of the waiting room for good (see
-- room.lua): its task no longer waits (it ran, or was deleted), or is
-- nowhere to be found. Its standby place goes to the next token.
--
-- KEYS[1..8] holders, queue, qexp, parked, standby, since, room, aside
-- ARGV[1] token
-- ARGV[2] '1' when this Service hands admitted tokens on (it has OnWake)
--
-- Reply: the tokens admitted (a list).

local now = clock()
forget(ARGV[1])
if ARGV[2] ~= '1' then return {} end
return admit(now, math.max(roomCapacity(0) - liveHolders(now), 0))
