-- Gives a session back to the run it had before a claim whose run was not started after
-- all (its start failed after the claim): only while that claim is still the head.
--
-- KEYS[1] session_key  dx:{session/<tenant>/<name>}:session       hash: head, from, at, n
-- KEYS[2] runs_key     dx:{session/<tenant>/<name>}:session_runs  zset: run id -> turn
-- ARGV[1] run          the run whose claim is released
-- ARGV[2] previous     the head before it ("" for none)
-- Returns 1 when released, 0 when the session had moved on.

local session_key, runs_key = KEYS[1], KEYS[2]
local run, previous = ARGV[1], ARGV[2]

if (redis.call('HGET', session_key, 'head') or '') ~= run then return 0 end
redis.call('HSET', session_key, 'head', previous, 'from', '', 'at', '0')
redis.call('HINCRBY', session_key, 'n', -1)
redis.call('ZREM', runs_key, run)
return 1
