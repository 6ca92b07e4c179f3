-- release.lua: give a seat back and wake the waiters first in line.
--
-- KEYS[1] holders  ZSET permit id -> lease expiry (server ms)
-- KEYS[2] labels   HASH permit id -> holder label
-- KEYS[3] queue    ZSET waiter entry -> ticket
-- ARGV[1] permit id
-- ARGV[2] capacity
-- ARGV[3] wake channel prefix (the entry's name is appended)
-- ARGV[4] the semaphore key, sent as the wake message
--
-- Reply: 1 when the seat was still held, 0 when it was already lost.

local holders, labels, queue = KEYS[1], KEYS[2], KEYS[3]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local s = redis.call('ZSCORE', holders, ARGV[1])
if not s then return 0 end
redis.call('ZREM', holders, ARGV[1])
redis.call('HDEL', labels, ARGV[1])
if tonumber(s) <= now then return 0 end

if redis.call('ZCARD', queue) > 0 then
  local free = tonumber(ARGV[2]) - redis.call('ZCOUNT', holders, '(' .. now, '+inf')
  if free > 0 then
    for _, e in ipairs(redis.call('ZRANGE', queue, 0, free - 1)) do
      redis.call('PUBLISH', ARGV[3] .. e, ARGV[4])
    end
  end
end
return 1
