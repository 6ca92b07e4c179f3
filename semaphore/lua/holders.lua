-- holders.lua: the live holders of a semaphore, soonest expiry first.
--
-- KEYS[1] holders  ZSET permit id -> lease expiry (server ms)
-- KEYS[2] labels   HASH permit id -> holder label
-- ARGV[1] 'count' to return only how many, 'list' for the holders
--
-- Reply: count: the number of live holders.
--        list: {now ms, id1, expiry1, label1, id2, ...} (label '' if none)

local holders, labels = KEYS[1], KEYS[2]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ARGV[1] == 'count' then
  return redis.call('ZCOUNT', holders, '(' .. now, '+inf')
end
local live = redis.call('ZRANGEBYSCORE', holders, '(' .. now, '+inf', 'WITHSCORES')
local out = {now}
if #live == 0 then return out end
local ids = {}
for i = 1, #live, 2 do ids[#ids + 1] = live[i] end
local names = redis.call('HMGET', labels, unpack(ids))
for i = 1, #ids do
  out[#out + 1] = ids[i]
  out[#out + 1] = live[2 * i]
  out[#out + 1] = names[i] or ''
end
return out
