-- gcra.lua: what every rate-limit script shares; it is prepended to each
-- of them (see script in ratelimit.go). Arguments come as name/value pairs
-- (args), replies go as name/value pairs too.
--
-- A rate limit is a generic cell rate (GCRA) kept as
-- github.com/go-redis/redis_rate keeps it, so that the two read each
-- other's keys (TestOurGCRAIsRedisRates pins it): the theoretical arrival
-- time (TAT), float seconds since 2017-01-01, with a TTL until the key is
-- back at full burst. The tasks that wait for tokens outside any process
-- (a job queue's) are tokens in the limit's room, first come first
-- served by arrival; one process at a time (the duty) lets them out as
-- their tokens come due, taking the tokens for them (paid), so that a
-- task let out runs when it comes, and nobody races for a token.
--
-- KEYS[1] rate:<prefix>{<tag>}  STRING: the TAT
-- KEYS[2] <KEYS[1]>:room         ZSET token -> arrival (server µs)
-- KEYS[3] <KEYS[1]>:paid         ZSET token -> until when its tokens wait
--                                for it (server ms)
-- KEYS[4] <KEYS[1]>:duty         STRING: the process that lets tasks out,
--                                leased

-- args reads ARGV's name/value pairs.
local function args()
  local a = {}
  for i = 1, #ARGV, 2 do a[ARGV[i]] = ARGV[i + 1] end
  return a
end

local jan2017 = 1483228800

-- clock is the server's time in redis_rate's seconds, and TIME's reply.
local function clock()
  local t = redis.call('TIME')
  return (t[1] - jan2017) + (t[2] / 1000000), t
end

-- micros is a TIME reply as the 16-digit string of microseconds that
-- arrivals are kept in.
local function micros(t)
  return t[1] .. string.format('%06d', tonumber(t[2]))
end

-- millis is a TIME reply in milliseconds.
local function millis(t)
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- try weighs a take of cost tokens at now, as redis_rate's allowN does:
-- whether it is allowed, the seconds until it would be, and the TAT after
-- it (or as it stands, when not allowed).
local function try(now, interval, burst, cost)
  local tat = tonumber(redis.call('GET', KEYS[1]) or now)
  tat = math.max(tat, now)
  local new = tat + interval * cost
  local allowAt = new - interval * burst
  if now < allowAt then return false, allowAt - now, tat end
  return true, 0, new
end

-- store keeps a TAT until it is back at full burst.
local function store(now, tat)
  local reset = tat - now
  if reset > 0 then redis.call('SET', KEYS[1], tat, 'EX', math.ceil(reset)) end
end

-- ahead is how far a TAT lies ahead of now, in µs: the tokens taken and
-- not earned back.
local function ahead(now, tat)
  return math.floor(math.max(tat - now, 0) * 1000000)
end

-- script body --
