-- park.lua: put a producer's new task, enqueued to wait, among the parked
-- (see room.lua), then let parked tokens out if places are free (a place
-- may have freed since it was refused one).
--
-- KEYS: those of room.lua
-- ARGV, name/value pairs: token, capacity, budget, transit, keyttl, wake,
--   share, shareweight, new, prefix, key, told (see acquire.lua)
--
-- Reply, name/value pairs: woken (tokens let out), first (1 when the
-- token is first in line among the parked).

local a = args()
local now, t = clock()
local nowus = micros(t)
local arrival, fresh, placed = arrivalOf(a.token, nowus, a)
local freed = park(a.token, arrival, a.new == '1', placed and arrival or '')
if fresh then noteShare(a, a.token, arrival, nowus) end
-- A token with others parked ahead of it, that gave up no place, lets
-- nobody out: they were left parked because no place was free, and each
-- call that frees one lets them out (a place that lapses, or a capacity
-- raised, waits for the sweep, admit.lua). Nor does it renew the parked
-- key's TTL, which the key had since it was made, and which noteRoom
-- renews. A backlog parks at 4 commands a task, where admit took 8.
local rank = redis.call('ZRANK', KEYS[5], a.token)
if not freed and rank > 0 then
  -- Nor does it tell the room its settings when its caller told them
  -- lately (told '1'): a room with tokens parked keeps its key.
  if a.told ~= '1' then noteRoom(a, now) end
  return {'woken', {}, 'first', 0}
end
noteRoom(a, now)
redis.call('PEXPIRE', KEYS[5], a.keyttl)
local woken, placed = {}, 0
if a.wake == '1' then woken, placed = admit(now, math.max(tonumber(a.capacity) - liveHolders(now), 0)) end
-- Spare seats are lent only while the room is empty, and recalled by the
-- call that first puts a token in it: a room that held standby places
-- before this call has none to recall.
if placed == 0 then recallSpares(a.prefix or '', a.key or '') end
local first = 0
if rank == 0 then first = 1 end
return {'woken', woken, 'arrivals', arrivals, 'first', first}
