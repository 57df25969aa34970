-- Let go of a lease this owner holds; never deletes another owner's lease.
-- One script so that the check and the delete are atomic: the lease cannot expire and be
-- taken by another owner between them.
--
-- KEYS[1] lease_key  dx:{R}:lease  string "<token>|<epoch>", PX ttl_ms
-- KEYS[2] run_key    dx:{R}:run    hash: the projection; its "held" field is cleared
-- ARGV[1] expected   the lease value this owner holds, "<token>|<epoch>"
-- Returns 1 when released, 0 when the lease is gone or held by another owner or epoch.

local lease_key, run_key = KEYS[1], KEYS[2]
local expected = ARGV[1]

if redis.call('GET', lease_key) == expected then
  redis.call('HDEL', run_key, 'held')
  return redis.call('DEL', lease_key)
end
return 0
