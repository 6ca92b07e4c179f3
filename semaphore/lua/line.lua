-- line.lua: the line of a waiting room, what every room script shares,
-- a paced room's (pace.lua) as well as a semaphore's (room.lua, which
-- comes after it): the call's arguments, the server's clock, the parked
-- tokens in arrival order (KEYS[5]), the standby places (KEYS[6]) and the
-- arrivals kept aside (KEYS[8]). See room.lua for the keys.

-- given is the call's arguments, once args read them.
local given = {}

-- args reads ARGV's name/value pairs.
local function args()
  local a = {}
  for i = 1, #ARGV, 2 do a[ARGV[i]] = ARGV[i + 1] end
  given = a
  return a
end

-- clock reads the server's time in milliseconds; it returns TIME's reply
-- too, for micros.
local function clock()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), t
end

-- micros is a TIME reply as the 16-digit string of microseconds that
-- arrivals are kept in.
local function micros(t)
  return t[1] .. string.format('%06d', tonumber(t[2]))
end

-- placeMember is a token's member of places: the token, a tab, and its
-- arrival, as the call that made the place had it (a token may hold a tab;
-- an arrival never does).
local function placeMember(token, arrival)
  return token .. '\t' .. arrival
end

-- splitPlace reads a member of places back: its token and arrival.
local function splitPlace(m)
  local token, arrival = string.match(m, '^(.*)\t([^\t]*)$')
  if not token then return m, nil end
  return token, arrival
end

-- placeOf looks for a token's member of places, among all of them (they
-- are few: the standby budget, or the seats free), when the caller does
-- not know the arrival it was made with: the member and the arrival, or
-- nil when it holds no place.
local function placeOf(token)
  for _, m in ipairs(redis.call('ZRANGE', KEYS[6], 0, -1)) do
    local tok, arrival = splitPlace(m)
    if tok == token and arrival then return m, arrival end
  end
  return nil
end

-- unplace takes a token's standby place, if it holds one (its arrival
-- goes with it); it reports whether it held one. A caller that knows the
-- arrival the place was made with (arrival; '': it knows the token holds
-- none) saves looking for it; a place made since with another (it lapsed,
-- and the token was let out again) is looked for.
local function unplace(token, arrival)
  if arrival == '' then return false end
  if arrival and redis.call('ZREM', KEYS[6], placeMember(token, arrival)) == 1 then return true end
  local m = placeOf(token)
  return m ~= nil and redis.call('ZREM', KEYS[6], m) == 1
end

-- asideFor is how long, in µs, a token that stepped aside keeps its place
-- at most; the key itself lapses with the room's other keys.
local asideFor = 3600 * 1000000

-- keepAside keeps a token's arrival aside for when its task comes back,
-- for keyttl ms after the last one kept; given nowus, it drops the
-- arrivals kept longer than asideFor.
local function keepAside(token, arrival, keyttl, nowus)
  redis.call('ZADD', KEYS[8], arrival, token)
  if nowus then
    redis.call('ZREMRANGEBYSCORE', KEYS[8], '-inf', '(' .. string.format('%d', tonumber(nowus) - asideFor))
  end
  redis.call('PEXPIRE', KEYS[8], keyttl)
end

-- park puts a token among the parked with its arrival, out of any slot
-- and place (its wait in a slot ended, or it never had one: new, and in
-- none of them; place as unplace's arrival). It reports whether the token
-- gave up a place.
local function park(token, arrival, new, place)
  if new then
    redis.call('ZADD', KEYS[5], 'NX', arrival, token)
    return false
  end
  redis.call('ZREM', KEYS[2], token)
  redis.call('HDEL', KEYS[3], token)
  local placed = unplace(token, place)
  redis.call('ZREM', KEYS[8], token)
  redis.call('ZADD', KEYS[5], 'NX', arrival, token)
  return placed
end
