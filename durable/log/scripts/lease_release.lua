-- Let go of a lease this owner holds; never deletes another owner's lease.
--
-- KEYS[1] lease string  dx:{R}:lease
-- ARGV[1] expected value "<token>|<epoch>"
-- Returns 1 when released, 0 otherwise.

if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
