-- room.lua: the tasks that wait for tokens of a key outside any process.
--
-- KEYS[1] room    ZSET token -> arrival (server µs)
-- KEYS[2] next    STRING: server µs before which no token is handed out
-- KEYS[3] duty    STRING: the process that hands tokens out, leased
-- KEYS[4] served  STRING, leased: a process that runs the tasks it brings
--                 back (a worker) asked for the duty lately
-- KEYS[5] aside   HASH token -> arrival (server µs) of the tokens handed out
--                 to a task of a paused queue, kept for when it parks again
-- ARGV[1] 'park': ARGV[2] token, ARGV[3] ms the room outlives this call,
--         ARGV[4] '1' when the token is new (it cannot be aside). A token
--         set aside takes back its arrival.
--         Reply: the tokens in the room, this one included.
--         'pop': the tokens are due: hand out the first token, unless the
--         next hand-out is not due yet. Hand-outs are spaced ARGV[2] µs (the
--         interval the limit earns the cost in) from the one before, not
--         from when a process asked, so that they keep pace with the rate
--         when the asking is late by up to half an interval; later than
--         that (or first), the next is spaced from now less half an
--         interval, so that processes asking at once wake one. ARGV[3]
--         is the asking process: it gives its duty up when the room is
--         empty; a producer (see below) hands nothing out while no worker
--         asked for the duty lately (KEYS[4]), so that tasks are not
--         brought back for nobody to run, nor once a worker took its duty
--         over, and asks again after ARGV[4] µs.
--         Reply: {token or '', µs to wait before asking again (until
--         the next hand-out, also after one; -1: the room is empty), the
--         token's arrival}
--         'void': a token handed out belonged to a task that no longer
--         waits (deleted, or run meanwhile): the next hand-out comes
--         ARGV[2] µs (the interval) sooner, as if it had not been made.
--         'aside': as 'void', for a token whose task waits in a paused
--         queue: ARGV[3] the token, ARGV[4] its arrival, kept (ARGV[5] ms)
--         for when it parks again.
--         Reply: 1.
--         'duty': ARGV[2] the asking process, ARGV[3] ms its duty lasts
--         (a worker, by its name below, says so for 3 leases in KEYS[4]):
--         take (or keep) the duty of handing tokens out, unless another
--         process holds it (a worker takes it over from a producer); the
--         holder gives it up once the room is empty.
--         Reply: {1 on duty | 0 not, 1 when the room is empty | 0}
--
-- A process's name in the duty is its ID, '/', and '1' for a worker, '0'
-- for a producer.

if ARGV[1] == 'duty' then
  local worker = string.sub(ARGV[2], -2) == '/1'
  if worker then redis.call('SET', KEYS[4], '1', 'PX', 3 * tonumber(ARGV[3])) end
  local holder = redis.call('GET', KEYS[3])
  if redis.call('EXISTS', KEYS[1]) == 0 then
    if holder == ARGV[2] then redis.call('DEL', KEYS[3]) end
    return {0, 1}
  end
  if holder and holder ~= ARGV[2] and not (worker and string.sub(holder, -2) == '/0') then return {0, 0} end
  redis.call('SET', KEYS[3], ARGV[2], 'PX', ARGV[3])
  return {1, 0}
end
if ARGV[1] == 'void' or ARGV[1] == 'aside' then
  local next = redis.call('GET', KEYS[2])
  if next then redis.call('SET', KEYS[2], tonumber(next) - tonumber(ARGV[2]), 'PX', math.ceil(tonumber(ARGV[2]) / 1000) + 1000) end
  if ARGV[1] == 'aside' then
    redis.call('HSET', KEYS[5], ARGV[3], ARGV[4])
    redis.call('PEXPIRE', KEYS[5], ARGV[5])
  end
  return 1
end
local t = redis.call('TIME')
local nowus = tonumber(t[1]) * 1000000 + tonumber(t[2])
if ARGV[1] == 'park' then
  local arrival = nowus
  if ARGV[4] ~= '1' then
    local kept = redis.call('HGET', KEYS[5], ARGV[2])
    if kept then
      arrival = kept
      redis.call('HDEL', KEYS[5], ARGV[2])
    end
  end
  redis.call('ZADD', KEYS[1], 'NX', arrival, ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return redis.call('ZCARD', KEYS[1])
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  if redis.call('GET', KEYS[3]) == ARGV[3] then redis.call('DEL', KEYS[3]) end
  return {'', -1}
end
if string.sub(ARGV[3], -2) == '/0' and (redis.call('EXISTS', KEYS[4]) == 0 or redis.call('GET', KEYS[3]) ~= ARGV[3]) then
  return {'', tonumber(ARGV[4])}
end
local next = tonumber(redis.call('GET', KEYS[2]) or '0')
if nowus < next then return {'', next - nowus} end
local first = redis.call('ZPOPMIN', KEYS[1])
local gap = tonumber(ARGV[2])
next = math.max(next, nowus - math.floor(gap / 2)) + gap
redis.call('SET', KEYS[2], next, 'PX', math.ceil(gap / 1000) + 1000)
return {first[1], next - nowus, first[2]}
