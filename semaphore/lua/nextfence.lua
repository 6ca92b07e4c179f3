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
  local floor = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local text = string.format('%.0f', floor)
  local last = tonumber(redis.call('SET', fenceKey, text, 'PX', ttl, 'GET') or '0')
  if last >= floor then
    text = string.format('%.0f', last + 1)
    redis.call('SET', fenceKey, text, 'PX', ttl)
  end
  return text
end

