-- release.lua: give a seat back, wake the waiters first in line, and take
-- the first parked token (see park.lua).
--
-- KEYS[1] holders  ZSET member -> lease expiry (server ms)
-- KEYS[2] queue    ZSET waiter entry -> ticket
-- KEYS[3] parked   ZSET token -> when it first parked
-- ARGV[1] member (permit id, or id "\n" label)
-- ARGV[2] capacity
-- ARGV[3] wake channel prefix (the entry's name is appended)
-- ARGV[4] the semaphore key, sent as the wake message
-- ARGV[5] '1' to take a parked token (the Service hands it on)
--
-- Reply: {1 when the seat was still held | 0 when it was already lost,
--         the first parked token when the seat was held ('' if none)}

local holders, queue = KEYS[1], KEYS[2]
local s = redis.call('ZSCORE', holders, ARGV[1])
if not s then return {0, ''} end
redis.call('ZREM', holders, ARGV[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if tonumber(s) <= now then return {0, ''} end

if redis.call('ZCARD', queue) > 0 then
  local free = tonumber(ARGV[2]) - redis.call('ZCOUNT', holders, '(' .. now, '+inf')
  if free > 0 then
    for _, e in ipairs(redis.call('ZRANGE', queue, 0, free - 1)) do
      redis.call('PUBLISH', ARGV[3] .. e, ARGV[4])
    end
  end
end
if ARGV[5] ~= '1' then return {1, ''} end
local first = redis.call('ZPOPMIN', KEYS[3])
if #first == 0 then return {1, ''} end
return {1, first[1]}
