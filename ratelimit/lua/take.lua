-- take.lua: one take of a rate limit's tokens (see gcra.lua).
--
-- ARGV, name/value pairs:
--   mode      take    take cost tokens now, or none
--             peek    say whether a take would be allowed, taking nothing
--             gate    a producer's new task: 1 (parked) when it should
--                     wait in the room (no tokens now, or tasks wait
--                     already), taking nothing; park it then with 'park'
--             park    put token in the room, keeping its arrival
--   interval  seconds one token takes to earn (per / rate)
--   burst, cost
--   token     the task's token in the room ('' for none)
--   queue     '1' (take): the task waits in the room when it gets no
--             tokens, and takes none while tasks parked before it wait
--   roomttl   ms the room outlives this call
--
-- Reply, name/value pairs: allowed (1 | 0), paid (1 when the tokens were
-- taken for the task as it was let out), parked (1 when the token waits
-- in the room), ahead (µs the TAT lies ahead of now, after the call),
-- retry (µs until the tokens are due; 0 when allowed).

local a = args()
local now, t = clock()
local interval, burst, cost = tonumber(a.interval), tonumber(a.burst), tonumber(a.cost)
local token = a.token or ''

local function answer(allowed, paid, parked, tat, retry)
  return {'allowed', allowed, 'paid', paid, 'parked', parked, 'ahead', ahead(now, tat), 'retry', math.ceil(retry * 1000000)}
end

local function park()
  redis.call('ZADD', KEYS[2], 'NX', micros(t), token)
  redis.call('PEXPIRE', KEYS[2], a.roomttl)
end

if a.mode == 'park' then
  park()
  return answer(0, 0, 1, now, 0)
end
if a.mode == 'take' and token ~= '' and redis.call('ZREM', KEYS[3], token) == 1 then
  return answer(1, 1, 0, tonumber(redis.call('GET', KEYS[1]) or now), 0)
end
local ok, wait, tat = try(now, interval, burst, cost)
-- Tasks parked first are served first.
local behind = false
if (a.mode == 'gate' or a.queue == '1') and redis.call('EXISTS', KEYS[2]) == 1 then
  local first = redis.call('ZRANGE', KEYS[2], 0, 0)
  behind = #first > 0 and first[1] ~= token
end
if a.mode == 'peek' then
  if ok then return answer(1, 0, 0, tat - interval * cost, 0) end
  return answer(0, 0, 0, tat, wait)
end
if a.mode == 'gate' then
  if ok and not behind then return answer(1, 0, 0, tat - interval * cost, 0) end
  return answer(0, 0, 1, tat, math.max(wait, interval * cost))
end
if ok and not behind then
  store(now, tat)
  if token ~= '' then redis.call('ZREM', KEYS[2], token) end
  return answer(1, 0, 0, tat, 0)
end
if a.queue == '1' and token ~= '' then park() end
return answer(0, 0, a.queue == '1' and 1 or 0, tat, math.max(wait, interval * cost))
