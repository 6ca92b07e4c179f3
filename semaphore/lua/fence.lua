-- fence.lua: the fence of a seat lent from a process's spare seats (see
-- spare.go), drawn when it is first asked for: above every fence granted
-- on the key before, as long as the spare seats are still held.
--
-- KEYS: those of room.lua
-- ARGV, name/value pairs: member (the spare seats' member of holders)
--
-- Reply, name/value pairs: fence ('0' when the seats are gone).

local a = args()
local now, t = clock()
local expiry = redis.call('ZSCORE', KEYS[1], a.member)
if not expiry or tonumber(expiry) <= now then return {'fence', '0'} end
return {'fence', nextFence(KEYS[9], t, tonumber(expiry) - now)}
