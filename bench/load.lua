-- (Kept for the benchmark's comparison: the library reads with HMGET + XRANGE instead.)
-- Read what recovery needs in one round trip: the projection and the log from the last
-- checkpoint (or from the start) to the end.
--
-- KEYS[1] log stream   dx:{R}:log
-- KEYS[2] projection   dx:{R}:run
-- ARGV: none
-- Returns {version, state, entries} where entries is XRANGE's reply.

local proj = redis.call('HMGET', KEYS[2], 'version', 'state', 'ckpt')
if not proj[1] then
  return {0, '', {}}
end
local from = proj[3] or '-'
return {tonumber(proj[1]), proj[2], redis.call('XRANGE', KEYS[1], from, '+')}
