-- forcerelease.lua: free every seat of a semaphore, wake every waiter, and
-- let tokens out of the waiting room (see room.lua) for the seats freed.
--
-- KEYS[1] holders  ZSET member -> lease expiry (server ms)
-- KEYS[2] queue    ZSET waiter entry -> ticket
-- KEYS[3] qexp     (unused)
-- KEYS[4..8]       the waiting room
-- ARGV[1] wake channel prefix (the entry's name is appended)
-- ARGV[2] the semaphore key, sent as the wake message
-- ARGV[3] '1' when this Service hands admitted tokens on (it has OnWake)
--
-- Reply: {how many live (unexpired) holders were displaced, the tokens
--         admitted from the room...}. Seats whose lease had run out count
--         as freed too: nobody released them, so nobody let tokens out.

local holders, queue = KEYS[1], KEYS[2]
local now = clock()
local live = redis.call('ZCOUNT', holders, '(' .. now, '+inf')
redis.call('DEL', holders)
for _, e in ipairs(redis.call('ZRANGE', queue, 0, -1)) do
  redis.call('PUBLISH', ARGV[1] .. e, ARGV[2])
end
local reply = {live}
if ARGV[3] == '1' then
  for _, token in ipairs(admit(now, roomCapacity(0))) do reply[#reply + 1] = token end
end
return reply
