-- room.lua: the tasks that wait for tokens of a key outside any process.
--
-- KEYS[1] room  ZSET token -> arrival (server µs)
-- KEYS[2] next  STRING: server µs before which no token is handed out
-- KEYS[3] duty  STRING: the process that hands tokens out, leased
-- ARGV[1] 'park': ARGV[2] token, ARGV[3] ms the room outlives this call.
--         Reply: 1.
--         'pop': the tokens are due: hand out the first token, unless the
--         next hand-out is not due yet. Hand-outs are spaced ARGV[2] µs (the
--         interval the limit earns the cost in) from the one before, not
--         from when a process asked, so that they keep pace with the rate
--         when the asking is late by up to half an interval; later than
--         that (or first), the next is spaced from now less half an
--         interval, so that processes asking at once wake one. ARGV[3]
--         is the asking process: it gives its duty up when the room is
--         empty.
--         Reply: {token or '', µs to wait before asking again (until
--         the next hand-out, also after one; -1: the room is empty)}
--         'duty': ARGV[2] the asking process, ARGV[3] ms its duty lasts:
--         take (or keep) the duty of handing tokens out, unless another
--         process holds it; the holder gives it up once the room is empty.
--         Reply: {1 on duty | 0 not, 1 when the room is empty | 0}

if ARGV[1] == 'duty' then
  local holder = redis.call('GET', KEYS[3])
  if redis.call('EXISTS', KEYS[1]) == 0 then
    if holder == ARGV[2] then redis.call('DEL', KEYS[3]) end
    return {0, 1}
  end
  if holder and holder ~= ARGV[2] then return {0, 0} end
  redis.call('SET', KEYS[3], ARGV[2], 'PX', ARGV[3])
  return {1, 0}
end
local t = redis.call('TIME')
local nowus = tonumber(t[1]) * 1000000 + tonumber(t[2])
if ARGV[1] == 'park' then
  redis.call('ZADD', KEYS[1], 'NX', nowus, ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return 1
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  if redis.call('GET', KEYS[3]) == ARGV[3] then redis.call('DEL', KEYS[3]) end
  return {'', -1}
end
local next = tonumber(redis.call('GET', KEYS[2]) or '0')
if nowus < next then return {'', next - nowus} end
local first = redis.call('ZPOPMIN', KEYS[1])
local gap = tonumber(ARGV[2])
next = math.max(next, nowus - math.floor(gap / 2)) + gap
redis.call('SET', KEYS[2], next, 'PX', math.ceil(gap / 1000) + 1000)
return {first[1], next - nowus}
