-- Take up to N runs whose due time has come, pushing each one's due time forward so that
-- another reconciler running at the same time does not take it too.
--
-- KEYS[1] due set  dx:due   (run id -> time in ms)
-- ARGV[1] now (ms)   ARGV[2] limit   ARGV[3] claim time (ms)
-- Returns the run ids taken.

local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
local until_ms = tonumber(ARGV[1]) + tonumber(ARGV[3])
for _, id in ipairs(ids) do
  redis.call('ZADD', KEYS[1], until_ms, id)
end
return ids
