-- acquire.lua: one attempt to take a seat, first-come-first-served across
-- the fleet; optionally hands over a seat being released by the caller.
--
-- KEYS[1] holders  ZSET member -> lease expiry (server ms); a member is the
--                  permit id, or the permit id, "\n" and the holder label
-- KEYS[2] queue    ZSET waiter entry -> ticket (arrival, server µs)
-- KEYS[3] qexp     ZSET waiter entry -> entry expiry (server ms)
-- KEYS[4..8]      the waiting room (see room.lua): a grant takes the
--                  caller's token (ARGV[12]) out; a seat freed or taken
--                  by a token lets the next tokens out
-- ARGV[1] member to grant
-- ARGV[2] lease TTL, ms
-- ARGV[3] capacity
-- ARGV[4] waiter entry ('' for a one-shot try that never queues)
-- ARGV[5] queue entry TTL, ms
-- ARGV[6] wake channel prefix (the entry's name is appended)
-- ARGV[7] the semaphore key, sent as the wake message
-- ARGV[8] the waiter's ticket ('' or absent for now)
-- ARGV[9] after a grant: ''/absent drops the entry, a ticket re-queues it
-- ARGV[10] member to release first (''/absent for none): a hand-over
-- ARGV[11] '1' when this Service hands admitted tokens on (it has OnWake)
-- ARGV[12] the caller's token in the room (''/absent for none): its
--          arrival is the waiter's ticket when ARGV[8] is empty, and a
--          grant seats it (see seated)
--
-- Tickets are integers of 16 digits: they travel as strings, because Lua
-- would print such a number with 14 significant digits.
--
-- The holders key lives at least as long as its longest lease: a grant
-- whose lease would outlive the key sets the key's expiry to twice the
-- lease, so most grants leave the expiry alone.
--
-- Reply: {granted 1|0, now ms, released 1 held|0 lost|-1 none, earliest
--         lease expiry ms (0 if none or granted), first ticket of another
--         entry in line ('' if none), now: seconds, now: microseconds
--         within the second (TIME's own two strings, unformatted), the
--         tokens admitted from the room (a list), seats still free after
--         this call, the waiter's ticket (its place in line; '' when that
--         is now, which the caller reads from TIME's strings)}

local holders, queue, qexp = KEYS[1], KEYS[2], KEYS[3]
local ttl = tonumber(ARGV[2])
local capacity = tonumber(ARGV[3])
local entry, qttl = ARGV[4], tonumber(ARGV[5])
local ticket, nextTicket, release = ARGV[8] or '', ARGV[9] or '', ARGV[10] or ''
local token = ARGV[12] or ''

local now, t = clock()
-- A token's arrival in the room is its place, set by the server: trusted.
local trusted = false
if ticket == '' and token ~= '' then
  local arrival = redis.call('HGET', KEYS[6], token)
  if arrival then ticket, trusted = arrival, true end
end

local released = -1
local freed = false
if release ~= '' then
  local s = redis.call('ZSCORE', holders, release)
  released = 0
  if s then
    redis.call('ZREM', holders, release)
    if tonumber(s) > now then
      released = 1
      freed = true
    end
  end
end
if redis.call('ZREMRANGEBYSCORE', holders, '-inf', now) > 0 then
  freed = true
end

local used = redis.call('ZCARD', holders)
local free = capacity - used
-- The line is empty on the fast path: then no queue work at all.
local waiting = redis.call('ZCARD', queue)
if waiting > 0 then
  local gone = redis.call('ZRANGEBYSCORE', qexp, '-inf', now, 'LIMIT', 0, 100)
  if #gone > 0 then
    redis.call('ZREM', qexp, unpack(gone))
    waiting = waiting - redis.call('ZREM', queue, unpack(gone))
  end
end

local granted = 0
if free > 0 then
  local ahead = 0
  if waiting > 0 then
    if entry == '' or ticket == '' then
      ahead = waiting
      if entry ~= '' and redis.call('ZSCORE', queue, entry) then ahead = ahead - 1 end
    else
      ahead = redis.call('ZCOUNT', queue, '-inf', '(' .. ticket)
      if ahead > 0 and not trusted and redis.call('ZSCORE', queue, entry) == false then
        -- a waiter whose entry is not queued is behind every queued entry
        ahead = waiting
      end
    end
  end
  if ahead < free then
    granted = 1
    used = used + 1
    free = free - 1
    redis.call('ZADD', holders, now + ttl, ARGV[1])
    if redis.call('PTTL', holders) < ttl then
      redis.call('PEXPIRE', holders, ttl * 2)
    end
    if token ~= '' then seated(token) end -- a token without a standby place leaves the room
    if entry ~= '' then
      if nextTicket ~= '' then
        waiting = waiting + redis.call('ZADD', queue, nextTicket, entry)
        redis.call('ZADD', qexp, now + qttl, entry)
        redis.call('PEXPIRE', queue, qttl * 2)
        redis.call('PEXPIRE', qexp, qttl * 2)
      elseif waiting > 0 then
        waiting = waiting - redis.call('ZREM', queue, entry)
        redis.call('ZREM', qexp, entry)
      end
    end
  end
end

if granted == 0 and entry ~= '' then
  if ticket == '' then
    waiting = waiting + redis.call('ZADD', queue, 'NX', micros(t), entry)
  elseif trusted then
    waiting = waiting + redis.call('ZADD', queue, 'LT', ticket, entry)
  else
    waiting = waiting + redis.call('ZADD', queue, ticket, entry)
  end
  redis.call('ZADD', qexp, now + qttl, entry)
  redis.call('PEXPIRE', queue, qttl * 2)
  redis.call('PEXPIRE', qexp, qttl * 2)
end

-- the entries first in line, to wake (seats this call freed and did not
-- take) and to report the first other waiter
local other = ''
if waiting > 0 and (entry ~= '' or (freed and free > 0)) then
  local wake = 0
  if freed and free > 0 then wake = free end
  local first = redis.call('ZRANGE', queue, 0, math.max(wake, 1), 'WITHSCORES')
  for i = 1, #first, 2 do
    local e = first[i]
    if e ~= entry then
      if other == '' then other = first[i + 1] end
      if (i + 1) / 2 <= wake then
        redis.call('PUBLISH', ARGV[6] .. e, ARGV[7])
      end
    end
  end
end

local earliest = 0
if granted == 0 then
  local e = redis.call('ZRANGE', holders, 0, 0, 'WITHSCORES')
  if #e > 0 then earliest = tonumber(e[2]) end
end
local tokens = {}
if ARGV[11] == '1' and released == 1 then
  tokens = admit(now, math.max(free, 0))
end
return {granted, now, released, earliest, other, t[1], t[2], tokens, math.max(free, 0), ticket}
