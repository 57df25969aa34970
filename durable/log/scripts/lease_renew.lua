-- Extend a lease this owner still holds (heartbeat).
-- One script so that the check and the extension are atomic: a lease that expired and was
-- taken by another owner in between is never extended.
--
-- KEYS[1] lease_key  dx:{R}:lease  string "<token>|<epoch>", PX ttl_ms
-- ARGV[1] expected   the lease value this owner holds, "<token>|<epoch>"
-- ARGV[2] ttl_ms     the lease's new time to live (ms)
-- Returns 1 when renewed, 0 when the lease is gone or held by another owner or epoch.

local lease_key = KEYS[1]
local expected, ttl_ms = ARGV[1], ARGV[2]

if redis.call('GET', lease_key) == expected then
  return redis.call('PEXPIRE', lease_key, ttl_ms)
end
return 0
