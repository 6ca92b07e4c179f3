-- wake.lua: count a release of a semaphore's seat and take the first task
-- of its parked line.
--
-- KEYS[1] parked line   LIST of "queue\0task id"
-- KEYS[2] release count STRING
-- ARGV[1] expiry of the count, ms
--
-- Reply: the first parked entry, or nil when none is parked.

redis.call('INCR', KEYS[2])
redis.call('PEXPIRE', KEYS[2], ARGV[1])
return redis.call('LPOP', KEYS[1])
