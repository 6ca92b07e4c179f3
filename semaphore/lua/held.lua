-- held.lua: whether a permit still holds its seat.
--
-- KEYS[1] holders  ZSET permit id -> lease expiry (server ms)
-- ARGV[1] permit id
--
-- Reply: 1 when the seat is held and its lease has not run out, else 0.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local s = redis.call('ZSCORE', KEYS[1], ARGV[1])
if s and tonumber(s) > now then return 1 end
return 0
