-- park.lua: record a token as waiting for a seat outside the Service (a
-- task that went back to its queue, say), unless a seat is free for a
-- newcomer now. The next release of a seat takes the first token (see
-- release.lua), so a token parked here is never passed over by a release
-- that came after the check. A token parks once: parking it again keeps
-- its place; it leaves when a release takes it, or when its owner takes a
-- seat (acquire.lua's ARGV[12]).
--
-- KEYS[1] holders  ZSET member -> lease expiry (server ms)
-- KEYS[2] queue    ZSET waiter entry -> ticket
-- KEYS[3] parked   ZSET token -> when it first parked (server µs)
-- ARGV[1] capacity
-- ARGV[2] token
-- ARGV[3] how long the line outlives its last park, ms
--
-- Reply: 1 parked, 0 a seat is free (try to take it instead).

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local used = redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')
if tonumber(ARGV[1]) - used > redis.call('ZCARD', KEYS[2]) then return 0 end
redis.call('ZADD', KEYS[3], 'NX', t[1] .. string.format('%06d', tonumber(t[2])), ARGV[2])
redis.call('PEXPIRE', KEYS[3], ARGV[3])
return 1
