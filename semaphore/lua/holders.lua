-- holders.lua: the live holders of a semaphore, soonest expiry first.
--
-- KEYS[1] holders  ZSET member -> lease expiry (server ms); a member is the
--                  permit id, or the permit id, "\n" and the holder label
-- ARGV[1] 'count' to return only how many, 'list' for the holders
--
-- Reply: count: the number of live holders.
--        list: {now ms, member1, expiry1, member2, expiry2, ...}

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ARGV[1] == 'count' then
  return redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')
end
local out = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'WITHSCORES')
table.insert(out, 1, now)
return out
