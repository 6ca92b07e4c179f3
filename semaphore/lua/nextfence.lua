-- nextfence.lua: the fence of a seat granted now, shared by room.lua's
-- scripts and quick.lua (it is prepended to each).
--
-- nextFence is above every fence granted on the key before (its last
-- one is in the STRING fenceKey). The last one is kept as long as the
-- lease granted with it, so that the key idles out with its seats; once
-- it lapsed, the server's clock (µs, from TIME's reply t) is the floor,
-- and it is past every fence granted before (fences run ahead of the
-- clock only by grants beyond one a µs).
local function nextFence(fenceKey, t, ttl)
  -- One command in the common case: the clock is past the last fence.
  -- The floor's digits are joined, not formatted: string.format cost a
  -- quick take a tenth of its Redis time.
  local us = t[2]
  local text = t[1] .. string.sub('00000', #us) .. us
  local last = redis.call('SET', fenceKey, text, 'PX', ttl, 'GET')
  if last and tonumber(last) >= tonumber(text) then
    text = string.format('%.0f', tonumber(last) + 1)
    redis.call('SET', fenceKey, text, 'PX', ttl)
  end
  return text
end
