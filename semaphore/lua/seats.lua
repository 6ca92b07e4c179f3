-- seats.lua: what every script that takes or frees seats shares, prepended
-- to it before room.lua (see roomScript in semaphore.go).
--
-- KEYS[1] holders  ZSET member -> lease expiry (server ms)

-- clock reads the server's time in milliseconds; it returns TIME's reply
-- too, for micros.
local function clock()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), t
end

-- micros is a TIME reply as the 16-digit string of microseconds that
-- tickets and arrivals are kept in.
local function micros(t)
  return t[1] .. string.format('%06d', tonumber(t[2]))
end

-- liveHolders drops lapsed leases and counts the rest.
local function liveHolders(now)
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  return redis.call('ZCARD', KEYS[1])
end
