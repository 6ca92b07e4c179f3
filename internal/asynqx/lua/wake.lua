-- wake.lua: bring a task that waits for a seat to the dequeuing end of its
-- queue, so that it runs before the tasks that came after it, but only
-- while it still waits for that seat: in the retry set with fleetcap's
-- requeue message for the key (sent back by its handler), in the scheduled
-- set with fleetcap's header (enqueued to wait), or pending already (run
-- by hand by an operator, or on its way after an earlier wake-up). A task
-- of a paused queue is made pending, where it waits for its queue to
-- resume, and the caller gives its place (or hand-out) to the next. A task that ran
-- meanwhile (completed, retrying after a real failure, archived), waits
-- for another key, or no longer exists (deleted) is left alone.
--
-- KEYS[1] asynq:{<queue>}:t:<id>     HASH: state, msg (the encoded task)
-- KEYS[2] asynq:{<queue>}:retry      ZSET id -> retry time
-- KEYS[3] asynq:{<queue>}:scheduled  ZSET id -> process time
-- KEYS[4] asynq:{<queue>}:pending    LIST of ids: enqueue LPUSHes, dequeue
--                                    RPOPs, so RPUSH runs it next
-- KEYS[5] asynq:{<queue>}:paused     STRING, set while the queue is paused
-- ARGV[1] task id
-- ARGV[2] text a retrying task's message holds while it waits for the seat
-- ARGV[3] text a scheduled task's message holds while it waits
-- ARGV[4] now, Unix ns (the pending_since asynq records)
--
-- Reply: 1 brought back (or pending already, now next in its queue),
--        0 left alone, 2 left alone because it is being processed (its
--        handler may be about to send it back to wait), 3 its queue is
--        paused (the task is pending, at the dequeuing end).

local task = redis.call('HMGET', KEYS[1], 'state', 'msg')
local state, msg = task[1], task[2]
if state == 'active' then return 2 end
local paused = redis.call('EXISTS', KEYS[5]) == 1
if state == 'pending' then
  if redis.call('LREM', KEYS[4], 1, ARGV[1]) > 0 then
    redis.call('RPUSH', KEYS[4], ARGV[1])
  end
  if paused then return 3 end
  return 1
end
local from = waitsIn(state, msg)
if not from then return 0 end
if redis.call('ZREM', from, ARGV[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'state', 'pending', 'pending_since', ARGV[4])
redis.call('RPUSH', KEYS[4], ARGV[1])
if paused then return 3 end
return 1
