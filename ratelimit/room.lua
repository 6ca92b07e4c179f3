-- room.lua: the tasks that wait for tokens of a key outside any process.
--
-- KEYS[1] room  ZSET token -> arrival (server µs)
-- KEYS[2] next  STRING: server µs before which no token is handed out
-- ARGV[1] 'park': ARGV[2] token, ARGV[3] ms the room outlives this call.
--         Reply: 1.
--         'pop': the tokens are due: hand out the first token, unless the
--         next hand-out is not due yet. Hand-outs are spaced ARGV[2] µs (the
--         interval the limit earns the cost in) from the one before, not
--         from when a process asked, so that they keep pace with the rate
--         when the asking is late by up to half an interval; later than
--         that (or first), the next is spaced from now less half an
--         interval, so that processes asking at once wake one.
--         Reply: {token or '', µs to wait before asking again (-1: the
--         room is empty)}

local t = redis.call('TIME')
local nowus = tonumber(t[1]) * 1000000 + tonumber(t[2])
if ARGV[1] == 'park' then
  redis.call('ZADD', KEYS[1], 'NX', nowus, ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return 1
end
local next = tonumber(redis.call('GET', KEYS[2]) or '0')
if nowus < next then return {'', next - nowus} end
local first = redis.call('ZPOPMIN', KEYS[1])
if #first == 0 then return {'', -1} end
local gap = tonumber(ARGV[2])
redis.call('SET', KEYS[2], math.max(next, nowus - math.floor(gap / 2)) + gap, 'PX', math.ceil(gap / 1000) + 1000)
return {first[1], 0}
