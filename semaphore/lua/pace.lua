-- pace.lua: a paced room (see pace.go): the tasks that wait for a rate
-- limit's tokens, parked in arrival order, and handed out one at a time,
-- at the limit's pace, by one process at a time (the duty). line.lua comes
-- before it.
--
-- KEYS: those of a semaphore's room (see room.lua; a paced room keeps
-- parked, KEYS[5], and aside, KEYS[8]), then
--   KEYS[13] next    STRING: server µs before which no token is handed out
--   KEYS[14] duty    STRING, leased: the process that hands tokens out
--   KEYS[15] served  STRING, leased: a process that runs the tasks it
--                    brings back (a worker) asked for the duty lately
-- ARGV, name/value pairs: op, and for
--   park: token, ttl (ms the room outlives this call), new ('1': the
--     token was made just now, and cannot be aside). A token that stepped
--     aside takes back its arrival; a parked one keeps its place.
--     Reply: parked (the tokens parked, this one included).
--   pop: gap (µs between two hand-outs: the interval the limit earns the
--     cost in), holder (the asking process), retry (µs a producer waits
--     to ask again while no worker asked for the duty lately). Hands out
--     the first token unless the next hand-out is not due yet. Hand-outs
--     are spaced gap from the one before, not from when a process asked,
--     so that they keep pace when the asking is late by up to half a gap;
--     later than that (or first), from now less half a gap, so that
--     processes asking at once hand out one. The holder gives its duty up
--     once the room is empty. A producer hands nothing out while no worker
--     asked for the duty lately (so that no task is brought back for
--     nobody to run), nor once a worker took its duty over.
--     Reply: token ('' when none), wait (µs before asking again: until the
--     next hand-out, also after one; -1: the room is empty), arrival.
--   void: gap. A token handed out belonged to a task that no longer waits
--     (deleted, or run meanwhile): the next hand-out comes gap sooner, as
--     if it had not been made. Reply: done.
--   aside: as void, for a token whose task waits in a paused queue (or
--     is still in a worker's hands): token and arrival, kept aside for ttl
--     ms, for when it parks again. Reply: done.
--   duty: holder, lease (ms the duty lasts; a worker says it asked for 3
--     leases in served): take or keep the duty, unless another process
--     holds it (a worker takes it over from a producer); the holder gives
--     it up once the room is empty.
--     Reply: onduty (1 | 0), empty (1 | 0).
--
-- A holder's name is its ID, '/', and '1' for a worker, '0' for a
-- producer.

local a = args()
local function isWorker(name) return string.sub(name, -2) == '/1' end

if a.op == 'duty' then
  if isWorker(a.holder) then redis.call('SET', KEYS[15], '1', 'PX', 3 * tonumber(a.lease)) end
  local holder = redis.call('GET', KEYS[14])
  if redis.call('EXISTS', KEYS[5]) == 0 then
    if holder == a.holder then redis.call('DEL', KEYS[14]) end
    return {'onduty', 0, 'empty', 1}
  end
  if holder and holder ~= a.holder and not (isWorker(a.holder) and not isWorker(holder)) then
    return {'onduty', 0, 'empty', 0}
  end
  redis.call('SET', KEYS[14], a.holder, 'PX', a.lease)
  return {'onduty', 1, 'empty', 0}
end
if a.op == 'void' or a.op == 'aside' then
  local gap = tonumber(a.gap)
  local next = redis.call('GET', KEYS[13])
  if next then redis.call('SET', KEYS[13], tonumber(next) - gap, 'PX', math.ceil(gap / 1000) + 1000) end
  if a.op == 'aside' then keepAside(a.token, a.arrival, a.ttl) end
  return {'done', 1}
end
local _, t = clock()
local arrival = micros(t)
local nowus = tonumber(arrival)
if a.op == 'park' then
  local kept = nil
  if a.new ~= '1' then kept = redis.call('ZSCORE', KEYS[8], a.token) end
  -- A paced room has no waiting, slots or places: a token that comes back
  -- from aside leaves only the aside, and parks as a new one would.
  if kept then redis.call('ZREM', KEYS[8], a.token) end
  park(a.token, kept or arrival, true, '')
  redis.call('PEXPIRE', KEYS[5], a.ttl)
  return {'parked', redis.call('ZCARD', KEYS[5])}
end
if a.op ~= 'pop' then return redis.error_reply('pace.lua: unknown op ' .. tostring(a.op)) end
if redis.call('EXISTS', KEYS[5]) == 0 then
  if redis.call('GET', KEYS[14]) == a.holder then redis.call('DEL', KEYS[14]) end
  return {'token', '', 'wait', -1}
end
if not isWorker(a.holder) and (redis.call('EXISTS', KEYS[15]) == 0 or redis.call('GET', KEYS[14]) ~= a.holder) then
  return {'token', '', 'wait', tonumber(a.retry)}
end
local next = tonumber(redis.call('GET', KEYS[13]) or '0')
if nowus < next then return {'token', '', 'wait', next - nowus} end
local first = redis.call('ZPOPMIN', KEYS[5])
local gap = tonumber(a.gap)
next = math.max(next, nowus - math.floor(gap / 2)) + gap
redis.call('SET', KEYS[13], next, 'PX', math.ceil(gap / 1000) + 1000)
return {'token', first[1], 'wait', next - nowus, 'arrival', first[2]}
