-- forcerelease.lua: free every seat of a semaphore, wake every waiter, and
-- take a parked token (see park.lua) for every seat freed.
--
-- KEYS[1] holders  ZSET member -> lease expiry (server ms)
-- KEYS[2] queue    ZSET waiter entry -> ticket
-- KEYS[3] parked   ZSET token -> when it first parked
-- ARGV[1] wake channel prefix (the entry's name is appended)
-- ARGV[2] the semaphore key, sent as the wake message
-- ARGV[3] '1' to take parked tokens (the Service hands them on)
--
-- Reply: {how many live (unexpired) holders were displaced, the parked
--         tokens taken...}. Seats whose lease had run out count as freed
--         too: nobody released them, so nothing woke their parked tasks.

local holders, queue = KEYS[1], KEYS[2]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local live = redis.call('ZCOUNT', holders, '(' .. now, '+inf')
local freed = redis.call('ZCARD', holders)
redis.call('DEL', holders)
for _, e in ipairs(redis.call('ZRANGE', queue, 0, -1)) do
  redis.call('PUBLISH', ARGV[1] .. e, ARGV[2])
end
local reply = {live}
if ARGV[3] == '1' then
  if freed > 0 then
    local popped = redis.call('ZPOPMIN', KEYS[3], freed)
    for i = 1, #popped, 2 do reply[#reply + 1] = popped[i] end
  end
end
return reply
