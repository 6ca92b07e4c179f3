-- settle.lua: a task that held a standby place took its seat and starts:
-- its token leaves the room (its place goes to the next token, let out in
-- the same call), unless it waits for the key again meanwhile.
--
-- KEYS: those of room.lua
-- ARGV, name/value pairs: token, wake, channel, prefix, key
--
-- Reply, name/value pairs: now, granted, woken (see acquire.lua).

local a = args()
local now, t = clock()
if not redis.call('ZSCORE', KEYS[2], a.token) and not redis.call('ZSCORE', KEYS[5], a.token) then
  -- It took its seat (which took it out of the waiting, and of its
  -- slots entry): its place, a fair key's note of its real arrival and,
  -- should a late wake-up have found its queue paused, its arrival kept
  -- aside, are all of it left in the room.
  if redis.call('ZREM', KEYS[6], a.token) > 0 then redis.call('HDEL', KEYS[7], a.token) end
  redis.call('ZREM', KEYS[9], a.token)
  redis.call('HDEL', KEYS[12], a.token)
  if not occupied() then
    redis.call('DEL', KEYS[8], KEYS[11], KEYS[12])
    return {'now', now, 'granted', {}, 'woken', {}}
  end
end
local own, woken = settle(now, t, roomCapacity(-1), a, true)
return {'now', now, 'granted', own, 'woken', woken}
