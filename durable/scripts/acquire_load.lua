-- Start a worker's job on a run in one round trip: drop the run's "queued" marker, take
-- its lease with a new fencing epoch, and read what recovery needs (the projection's
-- version and the log from the last checkpoint).
--
-- KEYS[1] lease string  dx:{R}:lease    KEYS[2] fence counter dx:{R}:fence
-- KEYS[3] queued marker dx:{R}:queued   KEYS[4] log stream    dx:{R}:log
-- KEYS[5] projection    dx:{R}:run
-- ARGV[1] owner token   ARGV[2] ttl (ms)
-- Returns {"busy", holder, pttl} or {"ok", lease value, version, entries}.

redis.call('DEL', KEYS[3])
local holder = redis.call('GET', KEYS[1])
local value
if holder then
  if string.sub(holder, 1, string.len(ARGV[1]) + 1) ~= ARGV[1] .. '|' then
    return {'busy', holder, redis.call('PTTL', KEYS[1])}
  end
  value = holder
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
else
  local epoch = redis.call('INCR', KEYS[2])
  value = ARGV[1] .. '|' .. epoch
  redis.call('SET', KEYS[1], value, 'PX', ARGV[2])
end
local proj = redis.call('HMGET', KEYS[5], 'version', 'ckpt')
if not proj[1] then
  return {'ok', value, 0, {}}
end
return {'ok', value, tonumber(proj[1]), redis.call('XRANGE', KEYS[4], proj[2] or '-', '+')}
