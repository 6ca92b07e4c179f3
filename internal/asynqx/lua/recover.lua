-- recover.lua: bring back the tasks of one asynq queue whose lease ran out
-- (their worker died or lost Redis), as asynq's own requeue does: out of
-- active and lease, to the head of pending. A task is brought back at most
-- ARGV[3] times this way; after that asynq's recoverer decides (it counts a
-- retry), so a task that kills its workers cannot loop for ever.
--
-- KEYS[1] asynq:{<queue>}:active   LIST of task ids
-- KEYS[2] asynq:{<queue>}:lease    ZSET task id -> lease expiry (Unix s)
-- KEYS[3] asynq:{<queue>}:pending  LIST of task ids
-- ARGV[1] cutoff, Unix seconds: leases that expired before it
-- ARGV[2] task key prefix, asynq:{<queue>}:t:
-- ARGV[3] how many times one task may be brought back
--
-- Reply: the ids brought back.

local ids = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. ARGV[1], 'LIMIT', 0, 100)
local out = {}
for _, id in ipairs(ids) do
  local task = ARGV[2] .. id
  local n = tonumber(redis.call('HGET', task, 'fleetcap_recovered') or '0')
  if n < tonumber(ARGV[3]) and redis.call('LREM', KEYS[1], 0, id) > 0 then
    redis.call('ZREM', KEYS[2], id)
    redis.call('RPUSH', KEYS[3], id)
    redis.call('HSET', task, 'state', 'pending', 'fleetcap_recovered', n + 1)
    out[#out + 1] = id
  end
end
return out
