-- Makes a run the latest of a named session, unless another start moved the session on
-- meanwhile: of two concurrent starts of one session, one claims it and the other is told
-- who did (durable.controls.sessions). A retried start of the run that holds the claim gets it again.
--
-- KEYS[1] session_key  dx:{session/<tenant>/<name>}:session       hash: head, from, at, n
-- KEYS[2] runs_key     dx:{session/<tenant>/<name>}:session_runs  zset: run id -> turn
-- ARGV[1] expected     the head the starter read ("" for a session with no run yet)
-- ARGV[2] run          the run to make the head
-- ARGV[3] continues    the run it continues ("" for the session's first)
-- ARGV[4] now_ms       the claim's time (ms)
-- ARGV[5] drop         "" or the abandoned claim it replaces (unlisted)
-- Returns {1, continues} when `run` is the head, {0, head} when another run is.

local session_key, runs_key = KEYS[1], KEYS[2]
local expected, run, continues = ARGV[1], ARGV[2], ARGV[3]
local now_ms, drop = ARGV[4], ARGV[5]

local head = redis.call('HGET', session_key, 'head') or ''
if head == run then
  return {1, redis.call('HGET', session_key, 'from') or ''}
end
if head ~= expected then return {0, head} end
local n = redis.call('HINCRBY', session_key, 'n', 1)
redis.call('HSET', session_key, 'head', run, 'from', continues, 'at', now_ms)
redis.call('ZADD', runs_key, n, run)
if drop ~= '' then redis.call('ZREM', runs_key, drop) end
return {1, continues}
