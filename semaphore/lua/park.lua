-- park.lua: record a token as waiting for a seat outside the Service (a
-- task that went back to its queue, say), unless a seat is free for a
-- newcomer now. The next release of a seat takes the first token (see
-- release.lua), so a token parked here is never passed over by a release
-- that came after the check.
--
-- KEYS[1] holders  ZSET member -> lease expiry (server ms)
-- KEYS[2] queue    ZSET waiter entry -> ticket
-- KEYS[3] parked   LIST of tokens
-- ARGV[1] capacity
-- ARGV[2] token
-- ARGV[3] how long the list outlives its last token, ms
--
-- Reply: 1 parked, 0 a seat is free (try to take it instead).

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local used = redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')
if tonumber(ARGV[1]) - used > redis.call('ZCARD', KEYS[2]) then return 0 end
redis.call('RPUSH', KEYS[3], ARGV[2])
redis.call('PEXPIRE', KEYS[3], ARGV[3])
return 1
