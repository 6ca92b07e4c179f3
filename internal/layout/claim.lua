-- claim.lua: check which Redis layout the fleet speaks and record this
-- process as a live speaker of its own, by the server's clock.
--
-- KEYS[1] the layout record, a HASH (no TTL):
--           "version"          -> the layout the fleet's data is in
--           "process " .. name -> "<layout> <lease expiry, server ms>"
-- ARGV[1] this build's layout (an integer)
-- ARGV[2] this process's name
-- ARGV[3] lease, ms
-- ARGV[4] "start": record the process (and the version) only when no
--         process of another layout is live and the recorded version is
--         not newer than ARGV[1]; "renew": record the process all the same
--         (a live process stays visible), and the version only when none
--         is recorded (a Redis that lost its data)
--
-- Lapsed processes are removed on the way. A process entry this script
-- cannot read counts as live, of layout "?": it is never removed here.
--
-- Reply: {recorded version ("" for none), 1 recorded | 0 refused,
--         then for each live process of another layout: name, layout,
--         ms its lease has left}

local record = KEYS[1]
local mine = tonumber(ARGV[1])
local name = ARGV[2]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local recorded = redis.call('HGET', record, 'version') or ''
local others = {}
local fields = redis.call('HGETALL', record)
for i = 1, #fields, 2 do
  local other = string.match(fields[i], '^process (.+)$')
  if other and other ~= name then
    local layout, expiry = string.match(fields[i + 1], '^(%d+) (%d+)$')
    if not layout then
      table.insert(others, other)
      table.insert(others, '?')
      table.insert(others, 0)
    elseif tonumber(expiry) <= now then
      redis.call('HDEL', record, fields[i])
    elseif tonumber(layout) ~= mine then
      table.insert(others, other)
      table.insert(others, layout)
      table.insert(others, tonumber(expiry) - now)
    end
  end
end

if ARGV[4] == 'start' then
  local v = tonumber(recorded)
  if #others > 0 or (recorded ~= '' and (v == nil or v > mine)) then
    local reply = {recorded, 0}
    for _, x in ipairs(others) do table.insert(reply, x) end
    return reply
  end
  redis.call('HSET', record, 'version', ARGV[1])
elseif recorded == '' then
  redis.call('HSET', record, 'version', ARGV[1])
end
redis.call('HSET', record, 'process ' .. name, ARGV[1] .. ' ' .. (now + tonumber(ARGV[3])))
local reply = {recorded, 1}
for _, x in ipairs(others) do table.insert(reply, x) end
return reply
