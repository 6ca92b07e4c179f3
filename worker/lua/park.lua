-- park.lua: put a task in a semaphore's parked line, unless a seat was
-- released since the caller last looked (then it should try again rather
-- than wait for a wake-up that already happened).
--
-- KEYS[1] parked line   LIST of "queue\0task id"
-- KEYS[2] release count STRING, raised by wake.lua at every release
-- ARGV[1] the release count the caller saw before its last try ('' = none)
-- ARGV[2] the entry
-- ARGV[3] expiry of both keys, ms
--
-- Reply: 1 parked, 0 a seat was released meanwhile.

local seen = redis.call('GET', KEYS[2]) or ''
if seen ~= ARGV[1] then return 0 end
redis.call('RPUSH', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
