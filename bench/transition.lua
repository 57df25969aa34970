-- The floor of one recorded event: the least a durable transition can cost in Redis.
-- One call appends one event to a run's log under a version check, updates the run's
-- projection and, for an event that claims or settles a step, its ledger key.
--
-- KEYS[1] log stream   KEYS[2] projection hash   KEYS[3] ledger hash
-- ARGV[1] expected version   ARGV[2] the event's bytes   ARGV[3] state   ARGV[4] step
-- ARGV[5] now (ms)           ARGV[6] ledger key ("" for none)   ARGV[7] ledger value
local version = tonumber(redis.call('HGET', KEYS[2], 'version')) or 0
if version ~= tonumber(ARGV[1]) then
  return {'conflict', version}
end
local last = redis.call('XADD', KEYS[1], '*', 'e', ARGV[2])
if ARGV[6] ~= '' then
  redis.call('HSET', KEYS[3], ARGV[6], ARGV[7])
end
redis.call('HSET', KEYS[2], 'version', version + 1, 'state', ARGV[3], 'step', ARGV[4],
  'last', last, 'updated', ARGV[5])
return {'ok', version + 1, last}
