-- duty.lua: the duty of watching an idle queue for pushes (see
-- ServerClient), held by one worker at a time.
--
-- KEYS[1] <prefix>idle:{<queue>}:duty  STRING: the worker on duty, leased
-- KEYS[2] <prefix>idle:{<queue>}:bell  LIST: the doorbell idle workers wait on
-- ARGV[1] 'take': take the duty unless another worker holds it (or keep
--         it), for ARGV[3] ms. Reply 1 on duty, 0 not.
--         'pass': give the duty up if held, and ring the doorbell once,
--         the ring lasting ARGV[3] ms.
--         'ring': ring the doorbell once, keeping the duty.
--         A ring is not added to one that nobody took yet (which lasts
--         ARGV[3] ms from now): reply 1 when it rang, 0 when a ring was
--         waiting already (no idle worker took it).
-- ARGV[2] the worker's id

local holder = redis.call('GET', KEYS[1])
if ARGV[1] == 'take' then
  if holder and holder ~= ARGV[2] then return 0 end
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
if ARGV[1] == 'pass' and holder == ARGV[2] then redis.call('DEL', KEYS[1]) end
-- One ring that nobody waited for is enough for the next worker to come.
local rung = 0
if redis.call('LLEN', KEYS[2]) == 0 then
  redis.call('LPUSH', KEYS[2], '1')
  rung = 1
end
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return rung
