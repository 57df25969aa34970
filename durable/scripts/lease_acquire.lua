-- Acquire (or re-acquire) a run's lease with a new fencing epoch.
--
-- KEYS[1] lease string  dx:{R}:lease   value "<token>|<epoch>", PX ttl
-- KEYS[2] fence counter dx:{R}:fence
-- ARGV[1] owner token   ARGV[2] ttl (ms)
-- Returns {"ok", value} or {"busy", holder, pttl}.

local holder = redis.call('GET', KEYS[1])
if holder then
  if string.sub(holder, 1, string.len(ARGV[1]) + 1) == ARGV[1] .. '|' then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {'ok', holder}
  end
  return {'busy', holder, redis.call('PTTL', KEYS[1])}
end
local epoch = redis.call('INCR', KEYS[2])
local value = ARGV[1] .. '|' .. epoch
redis.call('SET', KEYS[1], value, 'PX', ARGV[2])
return {'ok', value}
