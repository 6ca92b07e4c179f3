-- acquire.lua: one ask for a seat of a semaphore (see room.lua).
--
-- KEYS: those of room.lua
-- ARGV, name/value pairs:
--   mode      try     take a free seat, or nothing (TryAcquire)
--             join    take a free seat, or wait in a process: the token
--                     joins the waiting (Acquire)
--             enter   a job-queue task in a worker slot: a free seat (unless
--                     a token waiting in a process came first), else a
--                     standby place (wait in the slot), else parked
--             reserve a producer's new task, in no slot yet: a standby
--                     place (it may go to its queue), or nothing (it is
--                     enqueued to wait, then parked with park.lua)
--             recheck a waiting process's safety net: seats that freed
--                     without a release (a lease ran out) go to the
--                     waiting, and the process's presence is renewed
--   capacity  the key's seats (enter, reserve: 0 pauses the key)
--   id, label, ttl   the seat asked for: permit id, holder label, lease ms
--   seats     how many seats it takes (its weight; 1 when absent)
--   share, shareweight   its fair-share value and that value's weight (a
--             fair key, see room.lua), when it has one
--   new       '1': the token was never in the room (reserve, see
--             WithNewToken; join, an Acquire's first call), so it is not
--             looked for
--   since     join: the waiter's arrival (server µs), when it waited
--             behind in its process before it joins (see behind.go)
--   token     the asker's token (join, enter, reserve)
--   channel   the asker's process; prefix: the channels' prefix; key: the
--             semaphore's key, named in seat messages
--   procttl   ms the process's presence lasts (join, enter, recheck)
--   armed     enter: '1' when the process's recheck of the key waits
--             for a lease expiry still to come (see earliestArmed): the
--             reply's earliest is not looked up
--   told      enter: '1' when the caller's process told the room these
--             settings lately (see roomTold): a token in its place does
--             not tell them again (noteRoom)
--   placed    enter: the token's arrival, when the caller let it out of
--             the room itself (a reply's arrivals, see room.lua): its
--             place is looked for by renewing it
--   presence  enter: '0' when the process renewed its presence in the
--             key's room lately, so the call need not
--   wake      '1' when the caller brings tokens let out back (OnWake)
--   budget, hold, transit, keyttl   the room (enter, reserve): standby
--             places; ms a place held from a slot lasts; ms a place waits
--             for its task to show up; ms the room's keys outlive this call
--
--   spare, sparemember   enter: how many spare seats the process would
--             take with its seat, under that member (see spare.go): it
--             gets them only while nobody waits, and never into the upper
--             half of the key's seats
--   mine      recheck: how many of the process's waiting tokens follow,
--             as t1, m1, t2, m2, ... (token, and the member of the seat it
--             asked for): those given a seat are named in granted; when
--             the process's presence was dropped, or they stepped aside,
--             those no longer waiting in lost
--
-- Reply, name/value pairs: outcome (seat | standby | waiting | parked |
-- full), now (ms), arrival (the token's, µs), earliest (the soonest lease
-- expiry, ms, when the asker waits or stands by; 0 else), free (seats still
-- free), fence (the seat's fencing token, see nextFence; '0' without a
-- seat), kept (1 when a seat kept the token's standby place: settle it
-- once the task starts, settle.lua), spared (the spare seats taken
-- under sparemember), granted
-- (token, member, fence triples: the caller's waiters given a seat),
-- woken (tokens let out of the room, for the caller to bring back),
-- arrivals (theirs: token, arrival, ...), lost
-- (recheck: the caller's tokens to join again), resend (recheck: 1 when
-- the process's presence had been dropped and the call named none of its
-- tokens: it should name them next time); a join that got no seat,
-- and a recheck with head '1', also say the line's head and clear (see
-- lineHead).

local a = args()
local mode, token, capacity = a.mode, a.token or '', tonumber(a.capacity)
if mode ~= 'reserve' and mode ~= 'join' then a.new = nil end
local seats = tonumber(a.seats or '1')

-- slot is a waiting token's slots entry (see room.lua).
-- place: the arrival its standby place is kept with ('' for none).
local function slot(x, place)
  return x.channel .. '\t' .. x.id .. '\t' .. x.ttl .. '\t' .. x.capacity .. '\t' .. seats .. '\t' .. place .. '\t' .. (x.label or '')
end
local now, t = clock()
local nowus = micros(t)
-- A task let out of the room comes to its slot holding a place: the
-- common enter of a full key, so its place is looked for first (a room
-- that holds a place is not empty).
-- A caller that let the token out itself knows its arrival (placed, from
-- the reply's arrivals): the place is renewed as it is looked for, one
-- command for two.
local placedAt, renewed = false, false
if mode == 'enter' and token ~= '' then
  if a.placed and redis.call('ZADD', KEYS[6], 'XX', 'CH', now + tonumber(a.hold), placeMember(token, a.placed)) == 1 then
    placedAt, renewed = a.placed, true
  else
    placedAt = select(2, placeOf(token)) or false
  end
end
local waitedFor = true
if not placedAt then waitedFor = occupied() end
local roomed = waitedFor
if mode == 'enter' or mode == 'reserve' then
  roomed = roomed or redis.call('EXISTS', KEYS[8]) == 1
end
-- inPlace: the token holds a standby place (it was let out, and its task
-- is here).
local arrival, fresh, inPlace = nowus, true, false
if placedAt then
  arrival, fresh, inPlace = placedAt, false, true
elseif token ~= '' and (roomed or (a.share or '') ~= '' or (mode == 'join' and a.new ~= '1')) then
  -- (A rejoin, not new, is looked for even in a room with nobody else:
  -- it may have stepped aside, keeping its arrival.)
  arrival, fresh, inPlace = arrivalOf(token, nowus, a, mode == 'enter')
end
-- A waiter that waited behind in its process joins with its arrival.
if fresh and mode == 'join' and a.since and tonumber(a.since) < tonumber(arrival) then arrival = a.since end
-- keep records a new token's virtual arrival, for a fair key, once it is
-- kept in the room.
local function keep()
  if fresh then noteShare(a, token, arrival, nowus) end
end

-- An enter whose process's recheck of the key waits for a lease expiry
-- still to come (armed) finds no lapsed lease to drop: with one lease TTL
-- on the key, every lease lapses no sooner than that expiry. (A shorter
-- lease that lapsed meanwhile is dropped by that recheck, or by the
-- workers' sweep, admit.lua, as earliestArmed says.) One command less.
if mode == 'enter' and a.armed == '1' then sweptAt = now end
local free = math.max(capacity - liveHolders(now), 0)
local own, woken, lost, resend = {}, {}, {}, 0
local blocked = false
if roomed and free > 0 and mode ~= 'reserve' then
  -- Seats free while tokens wait in a process (a lease ran out): they go
  -- to those that came first (for a task in a slot: before it).
  local before = nil
  if mode == 'enter' then before = arrival end
  own, free, blocked = grant(now, t, free, a.channel or '', a.prefix or '', a.key or '', before)
end

local outcome, kept, fence, spared = 'full', 0, '0', 0
if mode == 'recheck' then
  -- A process whose presence was dropped (it was not heard of for long,
  -- and its waiters were dropped with it) joins its waiters again; seats
  -- given to its waiters while it did not listen (it was subscribing, or
  -- its subscription was cut) are given again, here.
  local fresh = redis.call('ZADD', KEYS[4], now + tonumber(a.procttl), a.channel) == 1
  local n = tonumber(a.mine or '0')
  local toks, waits = {}, {}
  for i = 1, n do toks[i] = a['t' .. i] end
  if n > 0 then waits = redis.call('ZMSCORE', KEYS[2], unpack(toks)) end
  for i = 1, n do
    local tok, m = toks[i], a['m' .. i]
    if not waits[i] then
      local expiry = redis.call('ZSCORE', KEYS[1], m)
      if expiry then
        -- Its seat's fence went in the message it missed: a new one.
        own[#own + 1] = tok
        own[#own + 1] = m
        own[#own + 1] = nextFence(KEYS[9], t, math.max(tonumber(expiry) - now, 1))
      elseif fresh or redis.call('ZSCORE', KEYS[8], tok) then
        -- Dropped with the presence, or stepped aside while the process
        -- was not heard of (see grant): it joins again, with its arrival.
        lost[#lost + 1] = tok
      end
    end
  end
  -- A presence dropped while the call names none of the process's tokens:
  -- the process asks again, naming them (resend).
  if fresh and n == 0 then resend = 1 end
  for i = 2, 4 do redis.call('PEXPIRE', KEYS[i], tonumber(a.procttl) * 2) end
  outcome = 'waiting'
elseif free >= seats and not blocked and mode ~= 'reserve' then
  -- (A waiter before it that needs more seats than are free blocks it:
  -- first come first served whatever the weight.)
  local member = a.id
  if (a.label or '') ~= '' then member = a.id .. '\n' .. a.label end
  fence = hold(member, seats, now, t, tonumber(a.ttl))
  free = free - seats
  outcome = 'seat'
  if roomed and token ~= '' then
    -- A task that holds a standby place keeps it until it starts (its
    -- caller settles it), so that the slots holding a task that does not
    -- run never outnumber the places; any other leaves the room now.
    if inPlace then
      kept = 1
    else
      forget(token, '') -- (its place was looked for: it holds none)
    end
  end
  local spare = tonumber(a.spare or '0')
  if spare > 0 and mode == 'enter' and not roomed then
    local give = math.min(spare, math.floor(capacity / 2) - (capacity - free))
    if give > 0 then
      holdSeats(a.sparemember, give, now, tonumber(a.ttl))
      redis.call('HSET', KEYS[12], a.sparemember, a.channel)
      redis.call('PEXPIRE', KEYS[12], tonumber(a.ttl) * 2)
      free = free - give
      spared = give
    end
  end
elseif mode == 'join' then
  redis.call('ZADD', KEYS[2], arrival, token)
  -- A token that joins again (rejoin: not new) may have stepped aside
  -- while its process was not heard of (see grant): back in line, it is
  -- aside no more.
  if not fresh then redis.call('ZREM', KEYS[8], token) end
  keep()
  redis.call('HSET', KEYS[3], token, slot(a, ''))
  redis.call('ZADD', KEYS[4], now + tonumber(a.procttl), a.channel)
  for i = 2, 4 do redis.call('PEXPIRE', KEYS[i], tonumber(a.procttl) * 2) end
  outcome = 'waiting'
elseif mode == 'enter' or mode == 'reserve' then
  local budget = tonumber(a.budget)
  local placed, standing = inPlace, nil
  if not placed and capacity > 0 then
    local first = redis.call('ZRANGE', KEYS[5], 0, 0)
    if #first == 0 or first[1] == token then
      standing = redis.call('ZCARD', KEYS[6])
      placed = standing < math.max(budget, free)
    end
  end
  if inPlace and a.told == '1' then
    -- The caller's process told the room these settings lately, and a
    -- room that holds a place keeps its key: whoever tells it its
    -- settings renews it (four times a keyttl).
    roomGiven(a)
  else
    noteRoom(a, now)
  end
  if placed then
    outcome = 'standby'
    local lease = tonumber(a.transit)
    if mode == 'enter' then lease = tonumber(a.hold) end
    if not inPlace and not fresh then
      -- Parked, or aside: it leaves for its place.
      redis.call('ZREM', KEYS[5], token)
      redis.call('ZREM', KEYS[8], token)
    end
    if not renewed then redis.call('ZADD', KEYS[6], now + lease, placeMember(token, arrival)) end
    keep()
    -- The places' keys live on as noteRoom renews them; new ones get
    -- their TTL here.
    if standing == 0 then keepPlaces(a.keyttl) end
    if mode == 'enter' then
      -- It waits in its slot for the next seat.
      redis.call('ZADD', KEYS[2], arrival, token)
      redis.call('HSET', KEYS[3], token, slot(a, arrival))
      -- Their keys live as long as the processes of their waiters renew
      -- them (each recheck, at most half a procttl apart, gives them two
      -- procttl): renewed here only when that is less than a procttl away
      -- (new keys, or keys whose waiters' processes died), one command
      -- rather than two.
      if redis.call('PTTL', KEYS[2]) < tonumber(a.procttl) then
        for i = 2, 3 do redis.call('PEXPIRE', KEYS[i], a.keyttl) end
      end
      -- The process's presence, unless it renewed it lately (presence
      -- '0': its rechecks renew it, see presenceFresh).
      if a.presence ~= '0' then
        redis.call('ZADD', KEYS[4], now + tonumber(a.procttl), a.channel)
        redis.call('PEXPIRE', KEYS[4], tonumber(a.procttl) * 2)
      end
    end
  elseif mode == 'enter' then
    outcome = 'parked'
    -- (A token in its place parks with the arrival its place was made
    -- with; any other holds none: its place was looked for.)
    park(token, arrival, false, inPlace and arrival or '')
    keep()
    redis.call('PEXPIRE', KEYS[5], a.keyttl)
  end
end
-- A producer's task refused a place parks next (park.lua), which lets
-- tokens out and recalls the spare seats: nothing of that here. A token
-- that holds its place keeps it: no place freed for another to be let
-- out, unless grant stepped a gone process's task aside (placeFreed).
local refused = mode == 'reserve' and outcome ~= 'standby'
if a.wake == '1' and (roomed or outcome ~= 'seat') and not refused and (placeFreed or not inPlace) then woken = admit(now, free) end

local earliest = 0
-- Spare seats are lent only while nobody waits, and the call that finds
-- the key full while nobody waits recalls them (so does park.lua): while
-- somebody waits, there are none to recall.
if outcome ~= 'seat' and not refused and not waitedFor then recallSpares(a.prefix or '', a.key or '') end
if (outcome == 'waiting' or outcome == 'standby') and a.armed ~= '1' then
  -- The waiter's process rechecks when the soonest lease runs out (unless
  -- it knows a later one already, armed: its recheck then learns the
  -- next).
  local e = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  if #e > 0 then earliest = tonumber(e[2]) end
end
local reply = {'outcome', outcome, 'now', now, 'fence', fence, 'arrival', arrival, 'earliest', earliest, 'free', free, 'kept', kept, 'spared', spared,
  'granted', own, 'woken', woken, 'arrivals', arrivals, 'lost', lost, 'resend', resend}
if (mode == 'join' or (mode == 'recheck' and a.head == '1')) and outcome ~= 'seat' then
  local head, clear = lineHead()
  reply[#reply + 1], reply[#reply + 2], reply[#reply + 3], reply[#reply + 4] = 'head', head, 'clear', clear
end
return reply
