-- handoff.lua: move a held seat from a releasing permit to the permit this
-- process already gave it to (a local hand-over). The seat stays taken
-- throughout, so the count of holders never changes.
--
-- KEYS[1] holders  ZSET member -> lease expiry (server ms)
-- KEYS[2] queue    ZSET waiter entry -> ticket (arrival, server µs)
-- KEYS[3] qexp     ZSET waiter entry -> entry expiry (server ms)
-- KEYS[4..8]      the waiting room (see room.lua): the taker's token
--                  (ARGV[7]) is seated (see seated)
-- ARGV[1] member giving the seat up
-- ARGV[2] member taking it
-- ARGV[3] the new lease's TTL, ms
-- ARGV[4] this process's waiter entry
-- ARGV[5] the ticket of its next local waiter ('' if none): the entry, if
--         queued, is re-stamped with it and refreshed; with none it
--         leaves the line in this call, so that nobody, this process's
--         next TryAcquire included, finds it standing ahead of a free seat
-- ARGV[6] queue entry TTL, ms
-- ARGV[7] the taker's token in the room ('' for none)
--
-- A moved seat frees none, so no token is let out of the room.
--
-- Reply: {1 moved | 0 the seat was already lost (nothing moved), now ms,
--         first ticket of another entry in line ('' if none), now µs}

local holders, queue, qexp = KEYS[1], KEYS[2], KEYS[3]
local ttl = tonumber(ARGV[3])
local now, t = clock()
local nowus = micros(t)

local moved = 0
local s = redis.call('ZSCORE', holders, ARGV[1])
if s then
  redis.call('ZREM', holders, ARGV[1])
  if tonumber(s) > now then
    moved = 1
    redis.call('ZADD', holders, now + ttl, ARGV[2])
    if redis.call('PTTL', holders) < ttl then
      redis.call('PEXPIRE', holders, ttl * 2)
    end
  end
end

local other = ''
local first = redis.call('ZRANGE', queue, 0, 1, 'WITHSCORES')
for i = 1, #first, 2 do
  if first[i] ~= ARGV[4] then
    other = first[i + 1]
    break
  end
end
if ARGV[5] ~= '' and #first > 0 then
  redis.call('ZADD', queue, 'XX', ARGV[5], ARGV[4])
  redis.call('ZADD', qexp, 'XX', now + tonumber(ARGV[6]), ARGV[4])
elseif ARGV[5] == '' and #first > 0 then
  redis.call('ZREM', queue, ARGV[4])
  redis.call('ZREM', qexp, ARGV[4])
end
if moved == 1 and ARGV[7] ~= '' then seated(ARGV[7]) end
return {moved, now, other, nowus}
