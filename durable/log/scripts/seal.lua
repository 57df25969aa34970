-- Record a run's seal: a signature over its log's hash chain head (durable.log.sealer),
-- made by the process that ended the run or holds its lease (or `durable seal`). One
-- script so that the seal lands only while the log still ends with the entry and head
-- that were signed: a seal never names a head the log has moved past. The seal is a key of
-- its own (a value over 64 bytes would turn the small projection hash into a full hash
-- table), expiring when the projection does.
--
-- KEYS[1] run_key   dx:{R}:run   hash: the projection (state; last = "<entry id> <head>")
-- KEYS[2] seal_key  dx:{R}:seal  string: the seal (JSON: by, key, entry, from, head,
--                                before, sig)
-- ARGV[1] last      the projection's "last" the seal was made for
-- ARGV[2] seal      the seal
-- Returns 1 when the seal is written, 0 when the run moved on (or is gone).

local run_key, seal_key = KEYS[1], KEYS[2]
local last, seal = ARGV[1], ARGV[2]

local projection = redis.call('HMGET', run_key, 'state', 'last')
if not projection[1] or projection[2] ~= last then
  return 0
end
local ttl = redis.call('PTTL', run_key)
if ttl > 0 then
  redis.call('SET', seal_key, seal, 'PX', ttl)
else
  redis.call('SET', seal_key, seal)
end
return 1
