-- Take up to `limit` runs whose due time has come, pushing each one's due time forward so
-- that another reconciler running at the same time does not take it too. One script so
-- that reading the due runs and pushing them forward is atomic: no two reconcilers take
-- the same run in the same window.
--
-- KEYS[1] due_key    dx:due   zset: run id -> due time (ms)
-- ARGV[1] now        current time (ms): runs due at or before it are taken
-- ARGV[2] limit      the most runs to take
-- ARGV[3] claim_ms   how long a taken run stays out of the others' reach (ms)
-- Returns the run ids taken, each now due again at now + claim_ms.

local due_key = KEYS[1]
local now, limit, claim_ms = ARGV[1], ARGV[2], ARGV[3]

local ids = redis.call('ZRANGEBYSCORE', due_key, '-inf', now, 'LIMIT', 0, limit)
local until_ms = tonumber(now) + tonumber(claim_ms)
for _, id in ipairs(ids) do
  redis.call('ZADD', due_key, until_ms, id)
end
return ids
