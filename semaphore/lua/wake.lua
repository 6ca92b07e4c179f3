-- wake.lua: wake the waiters first in line for the seats free now (after
-- a release made with plain commands found someone waiting).
--
-- KEYS[1] holders  ZSET member -> lease expiry (server ms)
-- KEYS[2] queue    ZSET waiter entry -> ticket
-- ARGV[1] capacity
-- ARGV[2] wake channel prefix (the entry's name is appended)
-- ARGV[3] the semaphore key, sent as the wake message
--
-- Reply: how many entries were woken.

local holders, queue = KEYS[1], KEYS[2]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local free = tonumber(ARGV[1]) - redis.call('ZCOUNT', holders, '(' .. now, '+inf')
if free <= 0 then return 0 end
local first = redis.call('ZRANGE', queue, 0, free - 1)
for _, e in ipairs(first) do
  redis.call('PUBLISH', ARGV[2] .. e, ARGV[3])
end
return #first
