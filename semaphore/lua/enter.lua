-- enter.lua: a task that waits for seats outside any process (the
-- worker's capped task) asks for one of key: it takes a free seat (when in
-- a slot), or holds a standby place (one of the key's standby budget: it
-- may wait in its slot for the next seat), or goes to the waiting room
-- (see room.lua). Tokens that came first keep their place: a newcomer
-- stands by only while nobody waits in the room.
--
-- KEYS[1] holders  ZSET member -> lease expiry (server ms)
-- KEYS[2] queue    ZSET waiter entry -> ticket (the Acquire line)
-- KEYS[3] qexp     ZSET waiter entry -> entry expiry (server ms)
-- KEYS[4..8]       the waiting room
-- ARGV[1] member to grant (permit id, or id "\n" label)
-- ARGV[2] lease TTL, ms
-- ARGV[3] capacity
-- ARGV[4] token
-- ARGV[5] standby budget
-- ARGV[6] how long a standby place held from a slot lasts, ms
-- ARGV[7] transit: how long a place promised to a task not yet in a slot
--         waits for it, ms
-- ARGV[8] how long the room's keys outlive this call, ms
-- ARGV[9] '1': the task is in a slot (it may take a seat, and goes to the
--         room when it gets nothing); '0': it is not yet (a producer asks:
--         it takes a place or nothing, and parks later with park.lua)
-- ARGV[10] '1' when this Service hands admitted tokens on (it has OnWake)
--
-- Reply: {1 seat | 2 standby place | 0 none (parked when ARGV[9] is '1'),
--         now ms, the token's arrival (server µs), the tokens admitted
--         (a list), seats still free, 1 when a seat kept the token's
--         standby place (see seated)}

local holders, queue, qexp = KEYS[1], KEYS[2], KEYS[3]
local parked, standby, since = KEYS[4], KEYS[5], KEYS[6]
local ttl, capacity, token = tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local budget, keyttl, inSlot = tonumber(ARGV[5]), ARGV[8], ARGV[9] == '1'
local now, t = clock()
local nowus = micros(t)

local free = capacity - liveHolders(now)
-- A token that stepped aside here counts: it takes its old place, and
-- leaves no arrival behind once seated.
local roomed = redis.call('EXISTS', parked, standby, KEYS[8]) > 0
local arrival = nowus
if roomed then
  reclaim(now)
  arrival = arrivalOf(token, nowus)
end
local outcome, kept = 0, 0
if inSlot and free > 0 then
  -- Waiters of the Acquire line that came first are served first.
  local ahead = 0
  if redis.call('ZCARD', queue) > 0 then
    local gone = redis.call('ZRANGEBYSCORE', qexp, '-inf', now, 'LIMIT', 0, 100)
    if #gone > 0 then
      redis.call('ZREM', qexp, unpack(gone))
      redis.call('ZREM', queue, unpack(gone))
    end
    ahead = redis.call('ZCOUNT', queue, '-inf', '(' .. arrival)
  end
  if ahead < free then
    outcome, free = 1, free - 1
    redis.call('ZADD', holders, now + ttl, ARGV[1])
    if redis.call('PTTL', holders) < ttl then redis.call('PEXPIRE', holders, ttl * 2) end
    if roomed then kept = seated(token) end
  end
end
if outcome == 0 then
  local lease = tonumber(ARGV[7])
  if inSlot then lease = tonumber(ARGV[6]) end
  if redis.call('ZSCORE', standby, token) then
    outcome = 2
  else
    local first = redis.call('ZRANGE', parked, 0, 0)
    local nobodyFirst = #first == 0 or first[1] == token
    if nobodyFirst and redis.call('ZCARD', standby) < math.max(budget, free) then
      outcome = 2
      redis.call('ZREM', parked, token)
    end
  end
  if outcome == 2 or inSlot then
    redis.call('HSET', KEYS[7], 'capacity', capacity, 'budget', budget, 'transit', ARGV[7], 'keyttl', keyttl)
  end
  if outcome == 2 then
    redis.call('ZADD', standby, now + lease, token)
    redis.call('HSETNX', since, token, arrival)
  elseif inSlot then
    redis.call('HSETNX', since, token, arrival)
    redis.call('ZADD', parked, 'NX', arrival, token)
  end
  if outcome == 2 or inSlot then redis.call('ZREM', KEYS[8], token) end
  for i = 4, 8 do redis.call('PEXPIRE', KEYS[i], keyttl) end
end
local tokens = {}
-- A seat taken from an empty room changes nobody's turn.
if ARGV[10] == '1' and (roomed or outcome ~= 1) then tokens = admit(now, free) end
return {outcome, now, arrival, tokens, free, kept}
