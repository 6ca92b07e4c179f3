-- wake.lua: bring a task that went back to its queue for want of a seat
-- back now, to the dequeuing end of its queue, so that it runs before the
-- tasks that came after it; but only while it still waits for that seat:
-- in the retry set with fleetcap's requeue message for the key, or, for a
-- task fleetcap enqueued to wait (a producer's, or a copy of a task with no
-- retry left), in the scheduled set with fleetcap's header. A task that ran meanwhile (completed, retrying after a real
-- failure, archived, pending, active) or waits for another key is left
-- alone.
--
-- KEYS[1] asynq:{<queue>}:t:<id>     HASH: state, msg (the encoded task)
-- KEYS[2] asynq:{<queue>}:retry      ZSET id -> retry time
-- KEYS[3] asynq:{<queue>}:scheduled  ZSET id -> process time
-- KEYS[4] asynq:{<queue>}:pending    LIST of ids: enqueue LPUSHes, dequeue
--                                    RPOPs, so RPUSH runs it next
-- ARGV[1] task id
-- ARGV[2] text a retrying task's message holds while it waits for the seat
-- ARGV[3] text a scheduled copy's message holds
-- ARGV[4] now, Unix ns (the pending_since asynq records)
--
-- Reply: 1 brought back, 0 left alone, 2 left alone because it is being
--        processed (its handler may be about to send it back to wait) or
--        does not exist yet (it may be being enqueued to wait).

local state = redis.call('HGET', KEYS[1], 'state')
local from, mark
if state == 'retry' then
  from, mark = KEYS[2], ARGV[2]
elseif state == 'scheduled' then
  from, mark = KEYS[3], ARGV[3]
elseif state == 'active' or not state then
  return 2
else
  return 0
end
local msg = redis.call('HGET', KEYS[1], 'msg')
if not msg or not string.find(msg, mark, 1, true) then return 0 end
if redis.call('ZREM', from, ARGV[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'state', 'pending', 'pending_since', ARGV[4])
redis.call('RPUSH', KEYS[4], ARGV[1])
return 1
