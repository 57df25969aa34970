-- Forget the partial output of a step whose call ended (its outcome goes to the log).
--
-- KEYS[1] index_key  dx:{R}:partials       hash: step -> bytes kept
-- KEYS[2] list_key   dx:{R}:partial:<step>  list: the step's messages
-- ARGV[1] step       the step number
-- Returns 1 when something was kept for the step, else 0.

local index_key, list_key = KEYS[1], KEYS[2]
local step = ARGV[1]

redis.call('HDEL', index_key, step)
return redis.call('DEL', list_key)
