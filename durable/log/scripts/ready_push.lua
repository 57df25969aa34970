-- Make runs ready on the fair side of a route's ready list (durable.flow.fairness): each run is
-- placed by start-time fair queueing, so ready runs are taken round-robin by tenant, and
-- moved by its priority (AGING rounds per level): a run of priority > 0 is placed from the
-- current round, ahead of its tenant's own ready runs.
--
-- KEYS[1] runs   zset run id -> score = start - priority * aging
-- KEYS[2] clock  hash "~v" -> the route's virtual time (the start of the last run taken),
--                "t:<tenant>" -> the start given to the tenant's last run
-- KEYS[3] prio   hash run id -> priority (only runs whose priority is not 0)
--
-- ARGV[1] aging  rounds a priority level moves a run ahead
-- then triples (run id, tenant, priority)
--
-- A run already ready keeps its place. Returns how many runs were added.

local runs, clock, prio = KEYS[1], KEYS[2], KEYS[3]
local aging = tonumber(ARGV[1])
local v = tonumber(redis.call('HGET', clock, '~v')) or 0
local added = 0
for i = 2, #ARGV, 3 do
  local run, tenant, p = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  if not redis.call('ZSCORE', runs, run) then
    local start = v + 1
    if p <= 0 then  -- behind the tenant's own ready runs (a higher priority jumps them)
      local last = tonumber(redis.call('HGET', clock, 't:' .. tenant)) or 0
      start = math.max(v, last) + 1
      redis.call('HSET', clock, 't:' .. tenant, start)
    end
    redis.call('ZADD', runs, start - p * aging, run)
    if p ~= 0 then redis.call('HSET', prio, run, p) end
    added = added + 1
  end
end
return added
