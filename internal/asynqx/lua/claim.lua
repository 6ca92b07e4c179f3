-- claim.lua: a dequeue of one task by its ID: the task that waits for a
-- seat (as wake.lua finds it: in the retry set with fleetcap's requeue
-- message for the key, or in the scheduled set with fleetcap's header)
-- goes straight to the active list with its lease, as asynq's dequeue
-- script leaves a task it pops, instead of to the dequeuing end of its
-- queue for the next dequeue to pop it (see ServerClient.Claim).
--
-- KEYS[1] asynq:{<queue>}:t:<id>     HASH: state, msg (the encoded task)
-- KEYS[2] asynq:{<queue>}:retry      ZSET id -> retry time
-- KEYS[3] asynq:{<queue>}:scheduled  ZSET id -> process time
-- KEYS[4] asynq:{<queue>}:active     LIST of ids, pushed at the left
-- KEYS[5] asynq:{<queue>}:lease      ZSET id -> lease expiry (Unix s)
-- KEYS[6] asynq:{<queue>}:paused     STRING, set while the queue is paused
-- ARGV[1] task id
-- ARGV[2] text a retrying task's message holds while it waits for the seat
-- ARGV[3] text a scheduled task's message holds while it waits
-- ARGV[4] the lease's expiry, Unix s (what asynq's dequeue was given)
--
-- Reply: the task's message (claimed), or 0 left alone (it waits no more),
--        2 left alone because it is being processed, 4 not claimed (it is
--        pending, or its queue is paused: wake.lua handles it).

local task = redis.call('HMGET', KEYS[1], 'state', 'msg')
local state, msg = task[1], task[2]
if state == 'active' then return 2 end
if state == 'pending' then return 4 end
local from = waitsIn(state, msg)
if not from then return 0 end
if redis.call('EXISTS', KEYS[6]) == 1 then return 4 end
if redis.call('ZREM', from, ARGV[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'state', 'active')
redis.call('LPUSH', KEYS[4], ARGV[1])
redis.call('ZADD', KEYS[5], ARGV[4], ARGV[1])
return msg
