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
  if not occupied() then redis.call('DEL', KEYS[7]) end
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

-- admit gives standby places to the tokens that arrived first, while fewer
-- than the budget (the standby budget, or the free seats when more) hold
-- one, and returns them. Places that lapsed (their task never showed up,
-- or its worker died) go back to the room first, keeping their place.
local function admit(now, free)
  if not occupied() then return {} end
  for _, token in ipairs(redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now, 'LIMIT', 0, 100)) do
    redis.call('ZREM', KEYS[5], token)
    local arrival = redis.call('HGET', KEYS[6], token)
    if arrival then redis.call('ZADD', KEYS[4], 'NX', arrival, token) end
  end
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
