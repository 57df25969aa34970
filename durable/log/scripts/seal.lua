-- Record a terminal run's seal: a signature over its log's hash chain head
-- (durable.log.chain), made by the process that ended the run (or `durable seal`). One
-- script so that the seal lands only while the run is still terminal and its log still
-- ends with the entry and head that were signed: a seal never names a head the log has
-- moved past.
--
-- KEYS[1] run_key  dx:{R}:run  hash: the projection (state; last = "<entry id> <head>")
-- ARGV[1] last     the projection's "last" the seal was made for
-- ARGV[2] seal     the seal (JSON: by, key, entry, sig), kept in the projection's "seal"
-- Returns 1 when the seal is written, 0 when the run moved on or is not terminal.

local run_key = KEYS[1]
local last, seal = ARGV[1], ARGV[2]

-- Rendered from durable.log.state.TERMINAL when the script is loaded.
local TERMINAL = {--[[TERMINAL]]}

local projection = redis.call('HMGET', run_key, 'state', 'last')
if not projection[1] or not TERMINAL[projection[1]] or projection[2] ~= last then
  return 0
end
redis.call('HSET', run_key, 'seal', seal)
return 1
