-- The floor: the least a durable step can cost in Redis. One call records the outcome of
-- the last step and the intent of the next, and claims the next key, under a version check.
--
-- KEYS[1] log stream   KEYS[2] projection hash   KEYS[3] ledger hash
-- ARGV[1] expected version   ARGV[2] outcome entry   ARGV[3] intent entry
-- ARGV[4] next key           ARGV[5] ledger value    ARGV[6] step   ARGV[7] now (ms)
local version = tonumber(redis.call('HGET', KEYS[2], 'version')) or 0
if version ~= tonumber(ARGV[1]) then
  return {'conflict', version}
end
redis.call('XADD', KEYS[1], '*', 'e', ARGV[2])
local last = redis.call('XADD', KEYS[1], '*', 'e', ARGV[3])
redis.call('HSET', KEYS[3], ARGV[4], ARGV[5])
redis.call('HSET', KEYS[2], 'version', version + 2, 'step', ARGV[6], 'last', last,
  'updated', ARGV[7])
return {'ok', version + 2, last}
