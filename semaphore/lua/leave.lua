-- leave.lua: take a waiter entry out of the line, waking whoever it held up.
--
-- KEYS[1] holders  ZSET permit id -> lease expiry (server ms)
-- KEYS[2] queue    ZSET waiter entry -> ticket
-- KEYS[3] qexp     ZSET waiter entry -> entry expiry
-- ARGV[1] waiter entry
-- ARGV[2] capacity
-- ARGV[3] wake channel prefix (the entry's name is appended)
-- ARGV[4] the semaphore key, sent as the wake message
--
-- Reply: 1 when the entry was queued, else 0.

local holders, queue, qexp = KEYS[1], KEYS[2], KEYS[3]
local removed = redis.call('ZREM', queue, ARGV[1])
redis.call('ZREM', qexp, ARGV[1])
if removed == 0 or redis.call('ZCARD', queue) == 0 then return removed end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local free = tonumber(ARGV[2]) - redis.call('ZCOUNT', holders, '(' .. now, '+inf')
if free > 0 then
  for _, e in ipairs(redis.call('ZRANGE', queue, 0, free - 1)) do
    redis.call('PUBLISH', ARGV[3] .. e, ARGV[4])
  end
end
return removed
