-- acquire.lua: one attempt to take a seat, first-come-first-served across
-- the fleet; optionally hands over a seat being released by the caller.
--
-- KEYS[1] holders  ZSET permit id -> lease expiry (server ms)
-- KEYS[2] labels   HASH permit id -> holder label
-- KEYS[3] queue    ZSET waiter entry -> ticket (arrival, server µs)
-- KEYS[4] qexp     ZSET waiter entry -> entry expiry (server ms)
-- ARGV[1] permit id to grant
-- ARGV[2] lease TTL, ms
-- ARGV[3] capacity
-- ARGV[4] holder label ('' for none)
-- ARGV[5] waiter entry ('' for a one-shot try that never queues)
-- ARGV[6] the waiter's ticket ('' for now)
-- ARGV[7] after a grant: '' drops the entry, a number re-queues it with that ticket
-- ARGV[8] queue entry TTL, ms
-- ARGV[9] permit id to release first ('' for none): a hand-over
-- ARGV[10] wake channel prefix (the entry's name is appended)
-- ARGV[11] the semaphore key, sent as the wake message
--
-- Tickets are integers of 16 digits: they travel as strings, because Lua
-- would print such a number with 14 significant digits.
--
-- Reply: {granted 1|0, now ms, released 1 held|0 lost|-1 none, earliest
--         lease expiry ms (0 if none), used seats, now µs}

local holders, labels, queue, qexp = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local ttl = tonumber(ARGV[2])
local capacity = tonumber(ARGV[3])
local entry = ARGV[5]
local qttl = tonumber(ARGV[8])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local nowus = t[1] .. string.format('%06d', tonumber(t[2]))

local released = -1
if ARGV[9] ~= '' then
  local s = redis.call('ZSCORE', holders, ARGV[9])
  released = 0
  if s then
    if tonumber(s) > now then released = 1 end
    redis.call('ZREM', holders, ARGV[9])
    redis.call('HDEL', labels, ARGV[9])
  end
end

local freed = released == 1
local dead = redis.call('ZRANGEBYSCORE', holders, '-inf', now, 'LIMIT', 0, 1000)
if #dead > 0 then
  redis.call('ZREM', holders, unpack(dead))
  redis.call('HDEL', labels, unpack(dead))
  freed = true
end
local gone = redis.call('ZRANGEBYSCORE', qexp, '-inf', now, 'LIMIT', 0, 1000)
if #gone > 0 then
  redis.call('ZREM', qexp, unpack(gone))
  redis.call('ZREM', queue, unpack(gone))
end

local used = redis.call('ZCARD', holders)
local free = capacity - used
local granted = 0
if free > 0 then
  local ticket = nowus
  if ARGV[6] ~= '' then ticket = ARGV[6] end
  local ahead = redis.call('ZCOUNT', queue, '-inf', '(' .. ticket)
  if entry == '' then
    ahead = redis.call('ZCARD', queue)
  elseif ahead > 0 and redis.call('ZSCORE', queue, entry) == false then
    -- a newcomer that never queued is behind every queued entry
    ahead = redis.call('ZCARD', queue)
  end
  if ahead < free then
    granted = 1
    used = used + 1
    free = free - 1
    redis.call('ZADD', holders, now + ttl, ARGV[1])
    if redis.call('PTTL', holders) < ttl then
      redis.call('PEXPIRE', holders, ttl)
    end
    if ARGV[4] ~= '' then
      redis.call('HSET', labels, ARGV[1], ARGV[4])
      redis.call('PEXPIRE', labels, redis.call('PTTL', holders))
    end
    if entry ~= '' then
      if ARGV[7] == '' then
        redis.call('ZREM', queue, entry)
        redis.call('ZREM', qexp, entry)
      else
        redis.call('ZADD', queue, ARGV[7], entry)
        redis.call('ZADD', qexp, now + qttl, entry)
      end
    end
  end
end

if granted == 0 and entry ~= '' then
  if ARGV[6] == '' then
    redis.call('ZADD', queue, 'NX', nowus, entry)
  else
    redis.call('ZADD', queue, ARGV[6], entry)
  end
  redis.call('ZADD', qexp, now + qttl, entry)
  redis.call('PEXPIRE', queue, qttl * 2)
  redis.call('PEXPIRE', qexp, qttl * 2)
end

-- seats this call freed and did not take: wake the entries first in line
if freed and free > 0 then
  local first = redis.call('ZRANGE', queue, 0, free - 1)
  for _, e in ipairs(first) do
    if e ~= entry then
      redis.call('PUBLISH', ARGV[10] .. e, ARGV[11])
    end
  end
end

local earliest = 0
if granted == 0 then
  local e = redis.call('ZRANGE', holders, 0, 0, 'WITHSCORES')
  if #e > 0 then earliest = tonumber(e[2]) end
end
return {granted, now, released, earliest, used, nowus}
