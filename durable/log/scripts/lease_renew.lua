-- Extend a lease this owner still holds (heartbeat).
--
-- KEYS[1] lease string  dx:{R}:lease
-- ARGV[1] expected value "<token>|<epoch>"   ARGV[2] ttl (ms)
-- Returns 1 when renewed, 0 when the lease is gone or held by another epoch.

if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
