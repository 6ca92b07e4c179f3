-- due.lua: the duty of a rate limit's room (see gcra.lua): let the tasks
-- that waited first out as their tokens come due, taking the tokens for
-- them (paid), up to max in one call. One process at a time holds the
-- duty, leased: another's call only learns that it is held.
--
-- ARGV, name/value pairs: interval, burst, cost (see take.lua), proc (the
--   calling process), duty (ms the duty's lease lasts), paidttl (ms the
--   tokens taken for a task wait for it), max
--
-- Reply, name/value pairs: duty (1 when the caller holds it), tokens (let
-- out, their tokens paid), wait (µs until the next task's tokens are due;
-- -1 when nobody waits).

local a = args()
local now, t = clock()
local holder = redis.call('GET', KEYS[4])
if holder and holder ~= a.proc then return {'duty', 0, 'tokens', {}, 'wait', 0} end
if redis.call('EXISTS', KEYS[2]) == 0 then
  if holder then redis.call('DEL', KEYS[4]) end
  return {'duty', 1, 'tokens', {}, 'wait', -1}
end
redis.call('SET', KEYS[4], a.proc, 'PX', a.duty)
local interval, burst, cost = tonumber(a.interval), tonumber(a.burst), tonumber(a.cost)
local out, wait = {}, -1
while #out < tonumber(a.max) do
  local ok, w, tat = try(now, interval, burst, cost)
  if not ok then
    wait = math.ceil(w * 1000000)
    break
  end
  local first = redis.call('ZPOPMIN', KEYS[2])
  if #first == 0 then break end
  store(now, tat)
  redis.call('ZADD', KEYS[3], millis(t) + tonumber(a.paidttl), first[1])
  out[#out + 1] = first[1]
end
if #out > 0 then
  redis.call('PEXPIRE', KEYS[3], a.paidttl)
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', millis(t))
  if wait < 0 and redis.call('EXISTS', KEYS[2]) == 1 then wait = 0 end
end
return {'duty', 1, 'tokens', out, 'wait', wait}
