-- extend.lua: push a held seat's lease expiry to now + TTL.
--
-- KEYS[1] holders  ZSET member -> lease expiry (server ms)
-- ARGV[1] member (permit id, or id "\n" label)
-- ARGV[2] new TTL, ms
-- ARGV[3] seats (its weight): its other seats are extended too (their
--         members are its id, "\1" and 2..seats; see room.lua)
--
-- Reply: {1 extended | 0 lost, now ms}

local holders = KEYS[1]
local ttl = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local s = redis.call('ZSCORE', holders, ARGV[1])
if (not s) or tonumber(s) <= now then
  if s then redis.call('ZREM', holders, ARGV[1]) end
  return {0, now}
end
local add = {'ZADD', holders, 'XX', now + ttl, ARGV[1]}
local id = string.match(ARGV[1], '^[^\n]*')
for i = 2, tonumber(ARGV[3] or '1') do
  add[#add + 1] = now + ttl
  add[#add + 1] = id .. '\1' .. i
end
redis.call(unpack(add))
if redis.call('PTTL', holders) < ttl then
  redis.call('PEXPIRE', holders, ttl * 2)
end
return {1, now}
