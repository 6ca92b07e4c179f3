-- release.lua: give a seat back, wake the waiters first in line, and let
-- the next tokens out of the waiting room (see room.lua).
--
-- KEYS[1] holders  ZSET member -> lease expiry (server ms)
-- KEYS[2] queue    ZSET waiter entry -> ticket
-- KEYS[3] qexp     (unused)
-- KEYS[4..8]       the waiting room
-- ARGV[1] member (permit id, or id "\n" label)
-- ARGV[2] capacity
-- ARGV[3] wake channel prefix (the entry's name is appended)
-- ARGV[4] the semaphore key, sent as the wake message
-- ARGV[5] '1' when this Service hands admitted tokens on (it has OnWake)
--
-- Reply: {1 when the seat was still held | 0 when it was already lost,
--         the tokens admitted from the room (a list; empty unless held)}

local holders, queue = KEYS[1], KEYS[2]
local s = redis.call('ZSCORE', holders, ARGV[1])
if not s then return {0, {}} end
redis.call('ZREM', holders, ARGV[1])
local now = clock()
if tonumber(s) <= now then return {0, {}} end

local lined = redis.call('ZCARD', queue) > 0
local roomed = ARGV[5] == '1' and occupied()
if not lined and not roomed then return {1, {}} end
local free = tonumber(ARGV[2]) - liveHolders(now)
if free > 0 and lined then
  for _, e in ipairs(redis.call('ZRANGE', queue, 0, free - 1)) do
    redis.call('PUBLISH', ARGV[3] .. e, ARGV[4])
  end
end
if not roomed then return {1, {}} end
return {1, admit(now, math.max(free, 0))}
