-- waits.lua: what wake.lua and claim.lua share; it is prepended to each
-- (see asynqx.go). Both take KEYS[2] the queue's retry set, KEYS[3] its
-- scheduled set, ARGV[2] the text a retrying task's message holds while it
-- waits for the seat (fleetcap's requeue message for the key), ARGV[3] the
-- text a scheduled task's message holds while it waits (fleetcap's
-- header).

-- waitsIn returns the set that holds a task of state and msg while it
-- waits for the seat, or nil when it waits for none (it ran, failed for
-- real, was archived, or waits for another key).
local function waitsIn(state, msg)
  local from, mark
  if state == 'retry' then
    from, mark = KEYS[2], ARGV[2]
  elseif state == 'scheduled' then
    from, mark = KEYS[3], ARGV[3]
  else
    return nil
  end
  if not msg or not string.find(msg, mark, 1, true) then return nil end
  return from
end
