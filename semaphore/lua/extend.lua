-- extend.lua: push a held seat's lease expiry to now + TTL.
--
-- KEYS[1] holders  ZSET permit id -> lease expiry (server ms)
-- KEYS[2] labels   HASH permit id -> holder label
-- ARGV[1] permit id
-- ARGV[2] new TTL, ms
--
-- Reply: {1 extended | 0 lost, now ms}

local holders, labels = KEYS[1], KEYS[2]
local ttl = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local s = redis.call('ZSCORE', holders, ARGV[1])
if (not s) or tonumber(s) <= now then
  if s then
    redis.call('ZREM', holders, ARGV[1])
    redis.call('HDEL', labels, ARGV[1])
  end
  return {0, now}
end
redis.call('ZADD', holders, 'XX', now + ttl, ARGV[1])
if redis.call('PTTL', holders) < ttl then
  redis.call('PEXPIRE', holders, ttl)
  if redis.call('EXISTS', labels) == 1 then
    redis.call('PEXPIRE', labels, ttl)
  end
end
return {1, now}
