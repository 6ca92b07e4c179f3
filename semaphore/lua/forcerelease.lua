-- forcerelease.lua: free every seat of a semaphore and wake every waiter.
--
-- KEYS[1] holders  ZSET permit id -> lease expiry (server ms)
-- KEYS[2] labels   HASH permit id -> holder label
-- KEYS[3] queue    ZSET waiter entry -> ticket
-- ARGV[1] wake channel prefix (the entry's name is appended)
-- ARGV[2] the semaphore key, sent as the wake message
--
-- Reply: how many live (unexpired) holders were displaced.

local holders, labels, queue = KEYS[1], KEYS[2], KEYS[3]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local live = redis.call('ZCOUNT', holders, '(' .. now, '+inf')
redis.call('DEL', holders, labels)
for _, e in ipairs(redis.call('ZRANGE', queue, 0, -1)) do
  redis.call('PUBLISH', ARGV[1] .. e, ARGV[2])
end
return live
