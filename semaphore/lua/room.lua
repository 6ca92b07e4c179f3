-- room.lua: the waiting room of a semaphore, prepended (after seats.lua) to
-- every script that frees, takes or promises seats for tasks that wait in
-- it (see roomScript in semaphore.go).
--
-- Tasks that wait for a seat outside any process (a job queue's tasks sent
-- back to their queue) are tokens in the room. A few of them at a time, the
-- key's standby budget, hold a standby place: they were let out to wait in
-- a worker slot for the next seat (or to take a free one). Admission lets
-- out the tokens that came first.
--
-- KEYS[4] parked   ZSET token -> arrival (server µs): in the room
-- KEYS[5] standby  ZSET token -> when its place lapses (server ms)
-- KEYS[6] since    HASH token -> arrival (server µs), for every token above
-- KEYS[7] room     HASH capacity, budget (standby places), transit (ms a
--                  place waits for its task to show up), keyttl (ms the
--                  room's keys outlive their last arrival)
-- KEYS[8] aside    ZSET token -> arrival (server µs): tokens that left the
--                  room for a while but keep their place for when their
--                  task comes back (it waits for another cap, or its queue
--                  is paused); kept at most asideFor, and lapses with
--                  the room's keys

-- occupied reports whether anyone is in the room or holds a standby place.
-- Scripts ask it first, so that a key nobody waits for costs one command.
local function occupied()
  return redis.call('EXISTS', KEYS[4], KEYS[5]) > 0
end

-- forget takes a token out of the room for good: its task took a seat, or
-- no longer waits. An empty room keeps no key.
local function forget(token)
  if token == nil or token == '' then return end
  redis.call('ZREM', KEYS[4], token)
  redis.call('ZREM', KEYS[5], token)
  redis.call('HDEL', KEYS[6], token)
  redis.call('ZREM', KEYS[8], token)
  if not occupied() then redis.call('DEL', KEYS[7]) end
end

-- asideFor is how long, in µs, a token that stepped aside keeps its place
-- at most; the key itself lapses with the room's other keys.
local asideFor = 3600 * 1000000

-- stepAside takes a token out of the room, giving up its standby place if
-- it holds one, but keeps its arrival (see arrivalOf) for when its task
-- comes back. nowus is the server time in µs, as a string.
local function stepAside(token, nowus)
  local arrival = redis.call('HGET', KEYS[6], token) or redis.call('ZSCORE', KEYS[8], token)
  local keyttl = redis.call('HGET', KEYS[7], 'keyttl') or '180000'
  forget(token)
  if not arrival then return end
  redis.call('ZADD', KEYS[8], arrival, token)
  redis.call('ZREMRANGEBYSCORE', KEYS[8], '-inf', '(' .. string.format('%d', tonumber(nowus) - asideFor))
  redis.call('PEXPIRE', KEYS[8], keyttl)
end

-- arrivalOf is a token's place: its arrival when it is in the room or
-- stepped aside, else nowus.
local function arrivalOf(token, nowus)
  return redis.call('HGET', KEYS[6], token) or redis.call('ZSCORE', KEYS[8], token) or nowus
end

-- seated is called when the task of a token takes a seat. A token that
-- holds a standby place keeps it until its task starts (the caller then
-- dismisses it: see Entry.Settle), so that the slots waiting never outnumber
-- the places; any other leaves the room now. Reply 1 when it kept a place.
local function seated(token)
  if token == nil or token == '' then return 0 end
  if redis.call('ZSCORE', KEYS[5], token) then return 1 end
  forget(token)
  return 0
end

-- roomCapacity is the capacity the room was last told of, or fallback.
local function roomCapacity(fallback)
  return tonumber(redis.call('HGET', KEYS[7], 'capacity') or fallback)
end

-- reclaim puts the tokens whose standby place lapsed (their task never
-- showed up: it was deleted, its worker died, or it is still on its way)
-- back in the room, keeping their place; admit lets them out again first.
local function reclaim(now)
  for _, token in ipairs(redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now, 'LIMIT', 0, 100)) do
    redis.call('ZREM', KEYS[5], token)
    local arrival = redis.call('HGET', KEYS[6], token)
    if arrival then redis.call('ZADD', KEYS[4], 'NX', arrival, token) end
  end
end

-- admit gives standby places to the tokens that arrived first, while fewer
-- than the budget (the standby budget, or the free seats when more) hold
-- one, and returns them. Places that lapsed go back to the room first
-- (reclaim).
local function admit(now, free)
  if not occupied() then return {} end
  reclaim(now)
  local room = redis.call('HMGET', KEYS[7], 'budget', 'transit', 'keyttl')
  local budget = math.max(tonumber(room[1] or '0'), free)
  local transit = tonumber(room[2] or '30000')
  local out = {}
  local standing = redis.call('ZCARD', KEYS[5])
  while standing < budget do
    local first = redis.call('ZPOPMIN', KEYS[4])
    if #first == 0 then break end
    redis.call('ZADD', KEYS[5], now + transit, first[1])
    standing = standing + 1
    out[#out + 1] = first[1]
  end
  if #out > 0 and room[3] then redis.call('PEXPIRE', KEYS[5], room[3]) end
  return out
end

-- script body --
