-- roomstats.lua: how many tasks wait for a key and since when, read from
-- its waiting room (see room.lua), for monitoring. It writes nothing.
--
-- KEYS: those of room.lua
-- ARGV, name/value pairs: placesmax (the most tokens in places whose
--   arrival is looked up: the oldest wait is the smallest arrival of all)
--
-- Reply, name/value pairs: now (server µs), parked, waiting (tokens
-- waiting in a process: Acquire callers, tasks standing by), places (in
-- use or lapsed), live (places in use, not lapsed), inboth (tokens in
-- places that also wait in a process: tasks standing by in a slot),
-- oldest (the smallest arrival, µs; 0 when nobody waits), aside (tokens
-- that stepped out of the line and keep their arrival: their queue is
-- paused, their worker died with them, they wait for another key, or
-- their task was deleted meanwhile and their note lapses later); and for
-- a fair key (see room.lua), whose arrivals are virtual: fair 1,
-- oldestreal (the earliest real arrival of a token still waiting, µs) and
-- values (value, count pairs: the a.top values with the most tokens
-- waiting, most first; at most a.realsmax tokens are looked at).

local a = args()
local now, t = clock()
local nowus = tonumber(micros(t))
local aside = redis.call('ZCARD', KEYS[8])
if not occupied() then return {'now', nowus, 'parked', 0, 'waiting', 0, 'places', 0, 'live', 0, 'inboth', 0, 'oldest', 0, 'aside', aside} end
local parked = redis.call('ZCARD', KEYS[5])
local waiting = redis.call('ZCARD', KEYS[2])
local places = redis.call('ZCARD', KEYS[6])
local live = redis.call('ZCOUNT', KEYS[6], '(' .. now, '+inf')
local oldest = 0
local function older(s)
  local v = tonumber(s)
  if v and (oldest == 0 or v < oldest) then oldest = v end
end
if parked > 0 then older(redis.call('ZRANGE', KEYS[5], 0, 0, 'WITHSCORES')[2]) end
if waiting > 0 then older(redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')[2]) end
local inboth = 0
if places > 0 then
  local tokens = redis.call('ZRANGE', KEYS[6], 0, tonumber(a.placesmax) - 1)
  for i, m in ipairs(tokens) do
    local arrival
    tokens[i], arrival = splitPlace(m)
    older(arrival)
  end
  if waiting > 0 then
    for _, s in ipairs(redis.call('ZMSCORE', KEYS[2], unpack(tokens))) do
      if s then inboth = inboth + 1 end
    end
  end
end
local fair, oldestreal, values = 0, 0, {}
if redis.call('EXISTS', KEYS[11]) == 1 then
  fair = 1
  local counts, names, placed = {}, {}, {}
  for _, m in ipairs(redis.call('ZRANGE', KEYS[6], 0, -1)) do placed[(splitPlace(m))] = true end
  local cursor, seen = '0', 0
  repeat
    local page = redis.call('HSCAN', KEYS[11], cursor, 'COUNT', 200)
    cursor = page[1]
    for i = 1, #page[2], 2 do
      local token, info = page[2][i], page[2][i + 1]
      if redis.call('ZSCORE', KEYS[5], token) or redis.call('ZSCORE', KEYS[2], token) or placed[token] then
        local real, value = string.match(info, '^([^\t]*)\t(.*)$')
        real = tonumber(real)
        if real and (oldestreal == 0 or real < oldestreal) then oldestreal = real end
        if not counts[value] then names[#names + 1] = value end
        counts[value] = (counts[value] or 0) + 1
      end
      seen = seen + 1
    end
  until cursor == '0' or seen >= tonumber(a.realsmax)
  table.sort(names, function(x, y) return counts[x] > counts[y] or (counts[x] == counts[y] and x < y) end)
  for i = 1, math.min(#names, tonumber(a.top)) do
    values[#values + 1] = names[i]
    values[#values + 1] = counts[names[i]]
  end
end
return {'now', nowus, 'parked', parked, 'waiting', waiting, 'places', places, 'live', live, 'inboth', inboth, 'oldest', oldest, 'aside', aside,
  'fair', fair, 'oldestreal', oldestreal, 'values', values}
