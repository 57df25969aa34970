-- Writes one schedule's definition and its next slot together, or deletes both: one script,
-- so a definition and the schedules' due-set never disagree (all three keys share the hash
-- tag {schedules}: one slot on a cluster).
--
-- KEYS[1] defs_key    dx:{schedules}:defs    hash: name -> JSON definition
-- KEYS[2] next_key    dx:{schedules}:next    zset: name -> next slot not yet handled (ms)
-- KEYS[3] errors_key  dx:{schedules}:errors  hash: name -> the last slot that failed (JSON)
-- ARGV[1] mode        "add": refused if the name exists; "put": refused unless it exists;
--                     "delete": drops the definition, its next slot and its last error
-- ARGV[2] name        the schedule's name
-- ARGV[3] definition  JSON (add, put; ignored by delete)
-- ARGV[4] next_ms     the next slot (ms), or "" for none (paused)
-- Returns 1 when written, 0 when refused (add: the name exists; put, delete: no such name).

local defs_key, next_key, errors_key = KEYS[1], KEYS[2], KEYS[3]
local mode, name, definition, next_ms = ARGV[1], ARGV[2], ARGV[3], ARGV[4]

local exists = redis.call('HEXISTS', defs_key, name) == 1
if mode == 'add' and exists then return 0 end
if mode ~= 'add' and not exists then return 0 end
if mode == 'delete' then
  redis.call('HDEL', defs_key, name)
  redis.call('ZREM', next_key, name)
  redis.call('HDEL', errors_key, name)
  return 1
end
redis.call('HSET', defs_key, name, definition)
if next_ms == '' then
  redis.call('ZREM', next_key, name)
else
  redis.call('ZADD', next_key, next_ms, name)
end
return 1
