-- keep.lua: what asynq's archive does to a task, but into the retry set:
-- a task that went back to wait for a seat with no retry left keeps its ID
-- and its retry count instead of being archived. The failed counters are
-- left alone: it did not fail.
--
-- KEYS[1] asynq:{<queue>}:t:<id>  HASH: state, msg
-- KEYS[2] asynq:{<queue>}:active  LIST of ids
-- KEYS[3] asynq:{<queue>}:lease   ZSET id -> lease expiry
-- KEYS[4] asynq:{<queue>}:retry   ZSET id -> when to retry, Unix s
-- ARGV[1] task id
-- ARGV[2] the encoded task asynq meant to archive (its error message set)
-- ARGV[3] when to retry, Unix s
--
-- Reply: status OK, as asynq's archive answers; an error when the task is
-- not active (asynq retries the call, as it would its own).

if redis.call('LREM', KEYS[2], 0, ARGV[1]) == 0 then
  return redis.error_reply('NOT FOUND')
end
if redis.call('ZREM', KEYS[3], ARGV[1]) == 0 then
  return redis.error_reply('NOT FOUND')
end
redis.call('ZADD', KEYS[4], ARGV[3], ARGV[1])
redis.call('HSET', KEYS[1], 'msg', ARGV[2], 'state', 'retry')
return redis.status_reply('OK')
