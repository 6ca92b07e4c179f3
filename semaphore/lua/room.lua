-- room.lua: what every script of a semaphore's seats and waiting room
-- shares; it is prepended to each of them, after line.lua (see roomScript
-- in semaphore.go). Arguments come as name/value pairs (args), replies go as
-- name/value pairs too (see reply in acquire.go). roomScript puts
-- defaultKeyTTL before it: the ms the room's keys outlive a call that did
-- not say (the Go package's defaultRoomTTL).
--
-- A seat is a leased member of holders. Whoever waits for a seat is a
-- token, in one of three places, first come first served by arrival
-- (server µs, kept however often its task goes back):
--   - waiting: in a process, listening on the process's channel for the
--     seat: a waiting Acquire, or a job-queue task standing by in a worker
--     slot. A seat that frees goes to the first of them in the same script
--     call (grant), and the message names the seat it holds: nobody races
--     for it, and nobody polls.
--   - parked: a job-queue task waiting outside any process, in its queue.
--   - in transit: a parked token let out (admit), with a place, on its way
--     to a worker slot.
-- A job-queue token that waits in a slot or is in transit holds one of
-- the key's standby places (a fleet-wide budget): admit lets the first
-- parked tokens out while places are free, for the caller to bring their
-- tasks to a slot.
--
-- KEYS[1] holders  ZSET member -> lease expiry (server ms); a member is a
--                  permit id, or a permit id, "\n" and its holder label;
--                  a permit of n seats (its weight) has n-1 more, its id,
--                  "\1" and 2..n (see extraSeat)
-- KEYS[2] waiting  ZSET token -> arrival (server µs): tokens in a process
-- KEYS[3] slots    HASH token -> "channel\tpermit id\tttl ms\tcapacity\t
--                  seats\tplace\tlabel": where to send a waiting token's
--                  seat, the seat it gets, the capacity it asked for, its
--                  weight, and the arrival its standby place is kept with
--                  ('' when it holds none)
-- KEYS[4] procs    ZSET channel -> when the process's presence lapses
--                  (server ms): a seat is never sent to a gone process
-- KEYS[5] parked   ZSET token -> arrival (server µs)
-- KEYS[6] places   ZSET token, a tab and its arrival (server µs; see
--                  placeMember) -> when its standby place lapses (server
--                  ms): a place keeps its token's arrival in one member
-- KEYS[7] room     HASH capacity, budget (standby places), transit (ms a
--                  place waits for its task to show up), keyttl (ms the
--                  room's keys outlive their last use), sig (see
--                  noteRoom), sweptat and auditat (see admit.lua)
-- KEYS[8] aside    ZSET token -> arrival (server µs): tokens that left for
--                  a while but keep their place for when their task comes
--                  back (it waits for another cap, or its queue is
--                  paused); kept at most asideFor, lapses with the room
-- KEYS[9] fence   STRING: the last fence granted on the key (see
--                  nextFence in nextfence.lua)
-- KEYS[10] shares  HASH fair-share value -> the arrival given last to a
--                  token of that value (see shareArrival)
-- KEYS[11] reals   HASH token -> "real arrival µs\tvalue", for the tokens
--                  of a fair key, whose arrivals are virtual
-- KEYS[12] spares  HASH member -> channel: the processes' spare seats of
--                  the key (see spare.go), which each gives back when
--                  its channel hears that the key is full (recallSpares)
--
-- A paced room (pace.lua) is a room of this kind whose parked tokens go
-- out one at a time at a pace (a rate limit's), not for seats and places:
-- it keeps parked and aside only, under names of its own (pace.go), and
-- its scripts take line.lua without the rest of this file.
--
-- Fair share. A token that asks with a share value (its tenant, say) and
-- a weight gets a virtual arrival (start-time fair queueing): the arrival
-- at the head of the line (or now, when nobody waits), or its value's
-- last arrival when later, plus 1000 / weight. So the values that wait
-- take turns, a value of weight 3 three times as often as one of weight
-- 1, first come first served within a value, and a value with nothing
-- waiting holds nothing back; everything else orders tokens by arrival as
-- before.

-- sweptAt is when (server ms) this call last dropped lapsed leases: once
-- a call is enough.
local sweptAt = nil

-- sweepHolders drops the leases that lapsed by now.
local function sweepHolders(now)
  if sweptAt == now then return end
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  sweptAt = now
end

-- liveHolders drops lapsed leases and counts the rest.
local function liveHolders(now)
  sweepHolders(now)
  return redis.call('ZCARD', KEYS[1])
end

-- extraSeat is the member of the i-th seat (2..n) of a permit of n seats.
local function extraSeat(member, i)
  return string.match(member, '^[^\n]*') .. '\1' .. i
end

-- holdSeats gives member seats seats until now + ttl; the holders key
-- lives at least as long as its longest lease.
local function holdSeats(member, seats, now, ttl)
  local add = {'ZADD', KEYS[1], now + ttl, member}
  for i = 2, seats do
    add[#add + 1] = now + ttl
    add[#add + 1] = extraSeat(member, i)
  end
  redis.call(unpack(add))
  if redis.call('PTTL', KEYS[1]) < ttl then redis.call('PEXPIRE', KEYS[1], ttl * 2) end
end

-- hold gives member seats seats until now + ttl, and returns its fence.
local function hold(member, seats, now, t, ttl)
  holdSeats(member, seats, now, ttl)
  return nextFence(KEYS[9], t, ttl)
end

-- recallSpares tells every process that holds spare seats of the key
-- that somebody found it full (a message "spare:" and the key on its
-- channel, prefix .. channel): each gives back the spare seats its tasks
-- do not use, and takes no more until it finds the key quiet again.
local function recallSpares(prefix, key)
  local held = redis.call('HGETALL', KEYS[12])
  if #held == 0 then return end
  local told = {}
  for i = 2, #held, 2 do
    if not told[held[i]] then
      told[held[i]] = true
      redis.call('PUBLISH', prefix .. held[i], 'spare:' .. key)
    end
  end
  redis.call('DEL', KEYS[12])
end

-- unhold takes member's seats seats back; it returns 1 when member held
-- one.
local function unhold(member, seats)
  local main = redis.call('ZREM', KEYS[1], member)
  if seats > 1 then
    local rem = {'ZREM', KEYS[1]}
    for i = 2, seats do rem[#rem + 1] = extraSeat(member, i) end
    redis.call(unpack(rem))
  end
  return main
end

-- occupied reports whether any token waits for the key. Scripts ask it
-- first, so that a key nobody waits for costs one command.
local function occupied()
  return redis.call('EXISTS', KEYS[2], KEYS[5], KEYS[6]) > 0
end

-- roomSettings is the room's capacity, budget, transit and keyttl as it
-- was last told of (see noteRoom), read once a call.
local roomRead = nil
local function roomSettings()
  if not roomRead then roomRead = redis.call('HMGET', KEYS[7], 'capacity', 'budget', 'transit', 'keyttl') end
  return roomRead
end

-- roomGiven takes the room's settings from the call's arguments (its
-- caller knows them), so that the call does not read them back.
local function roomGiven(a)
  roomRead = {a.capacity, a.budget, a.transit, a.keyttl}
end

-- roomCapacity is the capacity the room was last told of, or fallback.
local function roomCapacity(fallback)
  return tonumber(roomSettings()[1] or fallback)
end

-- dropRoom deletes the keys an empty room keeps no more: its settings and
-- a fair key's notes (the call reads the settings again if it asks).
local function dropRoom()
  redis.call('DEL', KEYS[7], KEYS[10], KEYS[11])
  roomRead = nil
end

-- forgetNotes takes what is left of a token out of the room for good once
-- its place is gone (placed: it held one, see unplace): its arrival kept
-- aside (a token in a place is never aside: each way into places leaves
-- aside) and a fair key's note of its real arrival (unless its caller
-- knows it has none: plain).
local function forgetNotes(token, placed, plain)
  if not placed then redis.call('ZREM', KEYS[8], token) end
  if not plain then redis.call('HDEL', KEYS[11], token) end
end

-- forgetRest is forgetNotes, after which an empty room keeps no key; it
-- reports whether anybody still waits.
local function forgetRest(token, placed, plain)
  forgetNotes(token, placed, plain)
  if occupied() then return true end
  dropRoom()
  return false
end

-- forgetPlaced takes a token that neither waits in a process nor is
-- parked out of the room for good: its place (arrival as unplace's), its
-- arrival kept aside, a fair key's note of its real arrival. An empty room
-- keeps no key; it reports whether anybody still waits.
local function forgetPlaced(token, arrival)
  return forgetRest(token, unplace(token, arrival))
end

-- forget takes a token out of the room for good: its task took a seat, or
-- no longer waits (arrival as unplace's). An empty room keeps no key.
local function forget(token, arrival)
  redis.call('ZREM', KEYS[2], token)
  redis.call('HDEL', KEYS[3], token)
  redis.call('ZREM', KEYS[5], token)
  forgetPlaced(token, arrival)
end

-- knownArrival is a token's place in line when it waits or stepped aside,
-- and whether it holds a standby place (true: the arrival is its place's,
-- see placeMember); unplaced: the caller looked for its place already.
local function knownArrival(token, unplaced)
  local at = redis.call('ZSCORE', KEYS[5], token)
  if at then return at, false end
  if not unplaced then
    local m
    m, at = placeOf(token)
    if m then return at, true end
  end
  return redis.call('ZSCORE', KEYS[2], token) or redis.call('ZSCORE', KEYS[8], token), false
end

-- shareArrival is the virtual arrival of a new token of share value
-- a.share, of weight a.shareweight (see Fair share above).
local function shareArrival(a, nowus)
  local head = nil
  for _, k in ipairs({KEYS[2], KEYS[5]}) do
    local first = redis.call('ZRANGE', k, 0, 0, 'WITHSCORES')
    if #first > 0 and (head == nil or tonumber(first[2]) < head) then head = tonumber(first[2]) end
  end
  local start = head or tonumber(nowus)
  local last = tonumber(redis.call('HGET', KEYS[10], a.share) or '0')
  return string.format('%.3f', math.max(start, last) + 1000 / tonumber(a.shareweight or '1'))
end

-- arrivalOf is a token's place in line: its arrival when it waits or
-- stepped aside; else, for a new token, nowus, or its virtual arrival when
-- it asks with a share value (a.share; a may be nil). The second result
-- is true for a new token, the third when it holds a standby place. A
-- token its caller says is new (a.new '1', see WithNewToken) is not looked
-- for, nor is a place its caller looked for already (unplaced).
local function arrivalOf(token, nowus, a, unplaced)
  local known, placed = nil, false
  if not (a and a.new == '1') then known, placed = knownArrival(token, unplaced) end
  if known then return known, false, placed end
  if a and (a.share or '') ~= '' then return shareArrival(a, nowus), true end
  return nowus, true
end

-- noteShare records the virtual arrival of a new token of a fair key, once
-- it is kept in the room (it waits, stands by or is parked).
local function noteShare(a, token, arrival, nowus)
  if (a.share or '') == '' then return end
  local keyttl = a.keyttl or redis.call('HGET', KEYS[7], 'keyttl') or defaultKeyTTL
  redis.call('HSET', KEYS[10], a.share, arrival)
  redis.call('HSET', KEYS[11], token, nowus .. '\t' .. a.share)
  redis.call('PEXPIRE', KEYS[10], keyttl)
  redis.call('PEXPIRE', KEYS[11], keyttl)
end

-- stepAside takes a token out of the room, giving up its standby place if
-- it holds one, but keeps its arrival for when its task comes back.
local function stepAside(token, nowus)
  local arrival, placed = knownArrival(token)
  local keyttl = redis.call('HGET', KEYS[7], 'keyttl') or defaultKeyTTL
  local real = redis.call('HGET', KEYS[11], token)
  -- (A token found parked, waiting or aside holds no place.)
  forget(token, placed and arrival or '')
  if not arrival then return end
  keepAside(token, arrival, keyttl, nowus)
  if real then
    -- A fair key's token keeps its real arrival too.
    redis.call('HSET', KEYS[11], token, real)
    redis.call('PEXPIRE', KEYS[11], keyttl)
  end
end

-- goneAfter is how long, in ms, a process's presence may have lapsed
-- before its waiters are dropped: far longer than a slow recheck.
local goneAfter = 30000

-- asideAfter is how long, in ms, a process's presence may have lapsed
-- before its tasks standing by step aside: as long again as a presence
-- lasts, when the process's waiting keys lapse too. A process that slow
-- is likely dead; if it is not, it finds its presence gone when it comes
-- back, and its tasks join the line again with their arrival.
local asideAfter = 3000

-- seatMessage is the message that sends a waiting token its seat: the
-- key, the token, the seat's member and its fence, each after its length
-- and a colon (any text may be in them), then the server's time (ms).
local function seatMessage(key, token, member, fence, now)
  return #key .. ':' .. key .. #token .. ':' .. token .. #member .. ':' .. member .. #fence .. ':' .. fence .. now
end

-- placeFreed is set when grant freed a standby place (a task of a
-- process not heard of stepped aside): the call lets the next token out
-- even when it freed no place itself.
local placeFreed = false

-- seatsFree reports whether seats seats are free: free of them, or, when
-- the caller does not know the capacity (free < 0), the waiter's own
-- capacity says.
local function seatsFree(now, free, seats, capacity)
  if free < 0 then return tonumber(capacity) - liveHolders(now) >= seats end
  return free >= seats
end

-- grant gives free seats to the tokens waiting in a process, first come
-- first served, as long as seats are free (and, with before, to those that
-- arrived before it). A waiter that needs more seats than are free stops
-- the line (blocked): nobody after it is served first, so that a heavy
-- waiter is not overtaken again and again (unless its process was not
-- heard of lately: see below). A token's seat is the permit it asked for
-- (its slots entry). A task standing by keeps its standby place until it
-- starts (its caller settles it, settle.lua), so that the slots holding a
-- task that does not run never outnumber the places. Seats for the
-- caller's own channel are returned, the others are sent on their
-- process's channel (prefix .. channel). A token whose process was not
-- heard of lately is passed over, whether or not its seats are free (it
-- gets a seat once its process is back), and, once the presence lapsed
-- asideAfter ago, gives up the standby place it holds (it steps aside,
-- keeping its arrival); one whose process is gone is dropped. It returns
-- the caller's grants (token, member, fence triples), the seats still
-- free, whether a waiter blocks the line, and how many tokens it gave a
-- seat, the caller's and others'. The arrivals the places of the caller's
-- tokens given a seat were made with go in grantedPlace.
local grantedPlace = {}
-- lineLeft is set when grant saw a token that still waits in a process
-- once it is done (one it passed over, or the one after the last it
-- served): the waiting's keys are there, with their TTL (see enrol).
local lineLeft = false
-- lineNext is set when grant's last look at the line served the first
-- token it saw: the tokens after it, with their arrivals, first in line
-- once grant is done (see nextInLine). Grant looks at lineLook tokens at
-- once, for the same command.
local lineNext = nil
local lineLook = 5
-- handing names the tokens of the caller's tasks that it handed a seat in
-- memory, whose hand-over is on its way (handover.lua): grant passes
-- them over (they take the seat they were handed).
local handing = {}
local function grant(now, t, free, mine, prefix, key, before)
  local own = {}
  local given = 0
  local skipped = 0
  local blocked = false
  while free ~= 0 do
    lineNext = nil
    local first, seen
    repeat
      first = redis.call('ZRANGE', KEYS[2], skipped, skipped + lineLook - 1, 'WITHSCORES')
      seen = #first
      while #first > 0 and handing[first[1]] do
        skipped = skipped + 1
        table.remove(first, 1)
        table.remove(first, 1)
      end
    until #first > 0 or seen == 0
    lineLeft = #first > 2 or skipped > 0
    if #first == 0 or (before and tonumber(first[2]) >= tonumber(before)) then
      if #first > 0 then lineLeft = true end
      break
    end
    local token = first[1]
    local info = redis.call('HGET', KEYS[3], token)
    local channel, id, ttl, capacity, seats, place, label
    if info then
      channel, id, ttl, capacity, seats, place, label =
        string.match(info, '^([^\t]*)\t([^\t]*)\t([^\t]*)\t([^\t]*)\t([^\t]*)\t([^\t]*)\t(.*)$')
    end
    if not channel then
      -- No slot, or one this layout cannot read (left by a process of
      -- layout 5 that was killed with its waiters in line): the token
      -- leaves the line.
      redis.call('ZREM', KEYS[2], token)
      if info then redis.call('HDEL', KEYS[3], token) end
    else
      seats = tonumber(seats)
      -- (The caller's own process is here: its presence is not looked up.)
      local presence = nil
      if channel ~= mine then presence = tonumber(redis.call('ZSCORE', KEYS[4], channel) or '0') end
      if presence and presence <= now then
        -- Its process has not been heard of lately: it may be slow, or
        -- gone. The seat goes to the next; a process gone for good
        -- (goneAfter) has its waiters dropped. A task standing by there
        -- steps aside (keeping its arrival for when its task comes back)
        -- once the presence lapsed asideAfter ago, so that its standby
        -- place goes on then, not when it lapses: after a worker's crash,
        -- the tasks parked behind its standbys are let out as soon as its
        -- seats free.
        if presence + asideAfter <= now and place ~= '' and placeOf(token) then
          stepAside(token, micros(t))
          placeFreed = true
          -- Its presence goes too: a process that was only slow finds it
          -- gone when it comes back, and its waiters join again (see
          -- recheck in acquire.lua), this one with its arrival.
          redis.call('ZREM', KEYS[4], channel)
        elseif presence + goneAfter <= now then
          -- Its process finds its presence gone if it comes back, and
          -- joins again (see recheck in acquire.lua).
          redis.call('ZREM', KEYS[2], token)
          redis.call('HDEL', KEYS[3], token)
          redis.call('ZREM', KEYS[4], channel)
        else
          skipped = skipped + 1
        end
      elseif not seatsFree(now, free, seats, capacity) then
        blocked = true
        lineLeft = true
        break
      else
        redis.call('ZREM', KEYS[2], token)
        redis.call('HDEL', KEYS[3], token)
        local member = id
        if label ~= '' then member = id .. '\n' .. label end
        local fence = hold(member, seats, now, t, tonumber(ttl))
        if free > 0 then free = free - seats end
        given = given + 1
        if #first > 2 then lineNext = {unpack(first, 3)} end
        if channel == mine then
          grantedPlace[token] = place
          own[#own + 1] = token
          own[#own + 1] = member
          own[#own + 1] = fence
        else
          redis.call('PUBLISH', prefix .. channel, seatMessage(key, token, member, fence, now))
        end
      end
    end
  end
  return own, free, blocked, given
end

-- keepPlaces gives the key of the standby places the room's TTL: when
-- admit or an enter makes it, and whenever noteRoom renews the room (four
-- times a keyttl while tasks come and go), rather than on every change of
-- it.
local function keepPlaces(keyttl)
  redis.call('PEXPIRE', KEYS[6], keyttl)
end

-- reclaim puts the tokens whose standby place lapsed (their task never
-- showed up: it was deleted, its worker died, or it is still on its way)
-- back among the parked, keeping their place; admit lets them out again
-- first. It returns how many it put back.
local function reclaim(now)
  local lapsed = redis.call('ZRANGEBYSCORE', KEYS[6], '-inf', now, 'LIMIT', 0, 100)
  for _, m in ipairs(lapsed) do
    local token, arrival = splitPlace(m)
    redis.call('ZREM', KEYS[6], m)
    park(token, arrival or now * 1000, false, '')
  end
  -- The parked key may be new: it lives as long as the room.
  if #lapsed > 0 then redis.call('PEXPIRE', KEYS[5], roomSettings()[4] or defaultKeyTTL) end
  return #lapsed
end

-- unstrand steps aside the tokens that hold a place renewed from a slot
-- (it lapses later than a place in transit can) at least twice
-- asideAfter ago (by the call's hold, the place's lease from a slot) but
-- wait in no process: their process stopped renewing the waiting (its
-- keys lapsed with its presence: it died) before they got a seat, or they
-- got one and did not start. So the places of a dead worker's tasks go on
-- once seats are free, rather than when they lapse; a task that took a
-- free seat as it came (it keeps its place until it starts) is left
-- alone. A call that does not say the hold steps none aside. It returns
-- how many it stepped aside.
local function unstrand(now, transit)
  local hold = tonumber(given.hold or '')
  if not hold then return 0 end
  local renewedBy = now + hold - 2 * asideAfter
  if renewedBy <= now + transit then return 0 end
  local held = redis.call('ZRANGEBYSCORE', KEYS[6], '(' .. (now + transit), renewedBy, 'LIMIT', 0, 100)
  if #held == 0 then return 0 end
  for i, m in ipairs(held) do held[i] = splitPlace(m) end
  local waits = redis.call('ZMSCORE', KEYS[2], unpack(held))
  local n = 0
  for i, token in ipairs(held) do
    if not waits[i] then
      stepAside(token, now * 1000)
      n = n + 1
    end
  end
  return n
end

-- arrivals names the tokens this call let out (admit) with their
-- arrivals, token after token: the reply's "arrivals", which the caller
-- keeps for their enter (see acquire.lua's placed).
local arrivals = {}

-- enrolling is set while admit lets tokens out for a caller that enrols
-- them (release.lua's enrol): each joins the waiting at once, as the
-- caller's waiter, in the place it is let out to, and its task, which the
-- caller brings to a slot, stands by there without an enter of its own
-- (see Room.Enrol). Its seat is one, of the caller's lease (given.ttl)
-- and capacity, labelled with its token's text after its last NUL byte.
-- enrolled names them: token, permit id, seat member, arrival, ...
local enrolling = false
local enrolled = {}

-- enrol makes the token let out with arrival a waiter of the caller's
-- process, with the n-th permit id of the call. Keys the waiting makes
-- get their TTL, as an enter's do; keys that were there keep theirs, which
-- the caller's process renews (it rechecks the key, and did lately: see
-- Service.enrols). Whether they were there is known without a look when
-- grant saw a token still waiting (lineLeft).
local function enrol(token, arrival, n)
  local id = given.enrolid .. '.' .. n
  local label = string.match(token, '[^%z]*$')
  local member = id
  if label ~= '' then member = id .. '\n' .. label end
  local made = n == 1 and not lineLeft and redis.call('EXISTS', KEYS[2]) == 0
  redis.call('ZADD', KEYS[2], arrival, token)
  redis.call('HSET', KEYS[3], token, given.channel .. '\t' .. id .. '\t' .. given.ttl .. '\t' .. given.capacity .. '\t1\t' .. arrival .. '\t' .. label)
  if made then
    for i = 2, 3 do redis.call('PEXPIRE', KEYS[i], given.keyttl) end
  end
  enrolled[#enrolled + 1], enrolled[#enrolled + 2], enrolled[#enrolled + 3], enrolled[#enrolled + 4] = token, id, member, arrival
end

-- admit gives standby places to the parked tokens that arrived first,
-- while fewer than the budget (the standby budget, or the free seats when
-- more) hold one, and returns them, and how many places there were before
-- the call. Lapsed places are looked for (reclaim) only when none is free:
-- a place that frees is let out for one command less, and a lapsed one is
-- put back once the places fill (or taken up again if its task comes
-- first). The places' keys get their TTL when admit makes them; noteRoom
-- renews it. A token let out for a caller that enrols it holds its place
-- as from a slot (see enrol).
local function admit(now, free)
  local before = redis.call('ZCARD', KEYS[6])
  if before == 0 and redis.call('EXISTS', KEYS[5]) == 0 then return {}, 0 end
  local room = roomSettings()
  local budget = math.max(tonumber(room[2] or '0'), free)
  local standing = before
  if standing > 0 and standing >= budget then standing = standing - reclaim(now) end
  local transit = tonumber(room[3] or '1000')
  -- Seats free while the places are full, nobody waits for them in a
  -- process, and no process was heard of lately (procs lapsed with the
  -- presences: while live processes wait, a dead one's waiters stay in
  -- line, and grant passes over them): the places may be stranded.
  if free > 0 and standing > 0 and standing >= budget and redis.call('EXISTS', KEYS[4]) == 0 then
    standing = standing - unstrand(now, transit)
  end
  local made = standing == 0
  local out = {}
  while standing < budget do
    local first = redis.call('ZPOPMIN', KEYS[5])
    if #first == 0 then break end
    local lease = transit
    if enrolling then lease = tonumber(given.hold) end
    redis.call('ZADD', KEYS[6], now + lease, placeMember(first[1], first[2]))
    standing = standing + 1
    out[#out + 1] = first[1]
    if enrolling then enrol(first[1], first[2], #out) end
    arrivals[#arrivals + 1], arrivals[#arrivals + 2] = first[1], first[2]
  end
  -- (A room whose settings are gone, dropped as it emptied a moment
  -- before or lapsed, keeps its places' keys for the default TTL.)
  if made and #out > 0 then keepPlaces(room[4] or defaultKeyTTL) end
  return out, before
end

-- passOnPlaces lets parked tokens out for the places that tokens leaving
-- the room (tasks that start) gave up, when the caller brings them back
-- (wake '1'), and returns them; a room the tokens left (left) empty keeps
-- no key (one that let a token out is not empty: one command less).
local function passOnPlaces(now, wake, left)
  local out = {}
  if wake == '1' then out = admit(now, 0) end
  if left and #out == 0 and not occupied() then dropRoom() end
  return out
end

-- settle runs after any change of seats: it gives the free seats to the
-- tokens waiting in a process, then lets parked tokens out for the places
-- and seats left (only when the caller brings tasks back: wake is '1').
-- It returns the caller's grants, the tokens let out, and true when it
-- knows that a seat is held (it counted the live ones, or gave one). A
-- caller that just found somebody waiting says so (known), for one
-- command less; one that freed seats and no place (seatsOnly) lets nobody
-- out once the seats went to the waiting: the places are as full as they
-- were (unless grant freed one, placeFreed).
local function settle(now, t, capacity, a, known, seatsOnly)
  if not known and not occupied() then return {}, {}, false end
  local free = -1 -- a capacity of -1: each waiter's own
  local seated = false
  if capacity >= 0 then
    local live = liveHolders(now)
    free = math.max(capacity - live, 0)
    seated = live > 0
  end
  local own, _, given
  own, free, _, given = grant(now, t, free, a.channel or '', a.prefix or '', a.key or '')
  local out = {}
  if a.wake == '1' and not (seatsOnly and free == 0 and not placeFreed) then out = admit(now, math.max(free, 0)) end
  return own, out, seated or given > 0
end

-- noteRoom tells the room its settings (a.capacity, a.budget, a.transit,
-- a.keyttl) and keeps its key alive. It writes them only when they
-- changed, and renews the key four times a keyttl: one command in the
-- common case (sig, the settings and the quarter of keyttl they were last
-- written in, says whether they are current).
local function noteRoom(a, now)
  local keyttl = tonumber(a.keyttl)
  local sig = a.capacity .. ':' .. a.budget .. ':' .. a.transit .. ':' .. a.keyttl .. ':'
    .. math.floor(now / math.max(math.floor(keyttl / 4), 1))
  roomGiven(a)
  if redis.call('HGET', KEYS[7], 'sig') == sig then return end
  redis.call('HSET', KEYS[7], 'capacity', a.capacity, 'budget', a.budget, 'transit', a.transit, 'keyttl', a.keyttl, 'sig', sig)
  redis.call('PEXPIRE', KEYS[7], keyttl)
  keepPlaces(keyttl)
  -- The parked key takes its TTL from whoever makes it, and is renewed
  -- here (park.lua renews it only for the first token parked).
  redis.call('PEXPIRE', KEYS[5], keyttl)
end

-- nextInLine is the tokens of first (tokens of the line and their
-- arrivals, as ZRANGE WITHSCORES gives them) first in line now, for the
-- caller to hand its seats to in memory, in turn, while they are its own
-- tasks standing by (handover.go): up to the first that a token this call
-- let out arrived before (that one joins the line ahead of it).
local function nextInLine(first)
  local out = {}
  if not first then return out end
  local floor = nil
  for i = 2, #arrivals, 2 do
    local at = tonumber(arrivals[i])
    if not floor or at < floor then floor = at end
  end
  for i = 1, #first - 1, 2 do
    if floor and tonumber(first[i + 1]) > floor then break end
    out[#out + 1] = first[i]
  end
  return out
end

-- noteHanding reads the caller's tokens on their way to a seat handed in
-- memory (a.handing, the count, and h1, h2, ...: see handing).
local function noteHanding(a)
  for i = 1, tonumber(a.handing or '0') do handing[a['h' .. i]] = true end
end

-- lineHead is the first tokens waiting in a process (at most 8), in line,
-- and 1 when no token is parked, placed or aside (clear): what a process
-- needs to know to hand seats to its own first waiters in memory
-- (handover.go).
local function lineHead()
  local first = redis.call('ZRANGE', KEYS[2], 0, 7)
  local clear = 0
  if redis.call('EXISTS', KEYS[5], KEYS[6], KEYS[8]) == 0 then clear = 1 end
  return first, clear
end

-- script body --
