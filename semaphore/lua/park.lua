-- park.lua: put a token in the waiting room (see room.lua): a task that
-- waits for a seat outside any process, such as a task sent back to its
-- queue. A token keeps the place it first took: a token that stood by
-- (its standby wait ran out) or stepped aside goes back with its arrival. Then let the
-- tokens that came first out, the parked one too when a place is free.
--
-- KEYS[1..8] holders, queue, qexp (unused), parked, standby, since, room, aside
-- ARGV[1] capacity
-- ARGV[2] token
-- ARGV[3] how long the room's keys outlive this call, ms
-- ARGV[4] standby budget
-- ARGV[5] transit: how long a place waits for its task, ms
-- ARGV[6] '1' when this Service hands admitted tokens on (it has OnWake)
--
-- Reply: the tokens admitted (a list).

local now, t = clock()
local nowus = micros(t)
local token, keyttl = ARGV[2], ARGV[3]
redis.call('HSET', KEYS[7], 'capacity', ARGV[1], 'budget', ARGV[4], 'transit', ARGV[5], 'keyttl', keyttl)
redis.call('HSETNX', KEYS[6], token, arrivalOf(token, nowus))
redis.call('ZREM', KEYS[8], token)
redis.call('ZREM', KEYS[5], token)
redis.call('ZADD', KEYS[4], 'NX', redis.call('HGET', KEYS[6], token), token)
for i = 4, 8 do redis.call('PEXPIRE', KEYS[i], keyttl) end
if ARGV[6] ~= '1' then return {} end
return admit(now, math.max(tonumber(ARGV[1]) - liveHolders(now), 0))
