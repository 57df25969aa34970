-- Delete an archived run's keys, only if the run is still what was archived: terminal, at
-- the version whose evidence was written, and held by no one. One script so that no event
-- can be appended between the check and the delete (it would be lost with the run).
--
-- KEYS[1] log_key     dx:{R}:log     stream: the run's log
-- KEYS[2] run_key     dx:{R}:run     hash: the projection (version, state)
-- KEYS[3] ledger_key  dx:{R}:fx      hash: the action ledger
-- KEYS[4] lease_key   dx:{R}:lease   string: a lease (none may be held)
-- KEYS[5] fence_key   dx:{R}:fence   counter: the fencing epoch
-- KEYS[6] queued_key  dx:{R}:queued  marker: a command for the run is queued
-- KEYS[7] blobs_key   dx:{R}:blobs   hash: the run's large values (archived with the log)
-- KEYS[8] seal_key    dx:{R}:seal    string: the run's seal (archived with the log)
-- ARGV[1] version     the projection's version the archive holds
-- Returns {"ok"}, or {"changed", version, state} when the run moved on (nothing deleted),
-- or {"held"} when a lease is held.

local log_key, run_key, ledger_key = KEYS[1], KEYS[2], KEYS[3]
local lease_key, fence_key, queued_key, blobs_key = KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local seal_key = KEYS[8]
local version = ARGV[1]

-- Rendered from durable.log.state.TERMINAL when the script is loaded.
local TERMINAL = {--[[TERMINAL]]}

local projection = redis.call('HMGET', run_key, 'version', 'state')
if projection[1] ~= version or not TERMINAL[projection[2]] then
  return {'changed', projection[1] or '', projection[2] or ''}
end
if redis.call('EXISTS', lease_key) == 1 then
  return {'held'}
end
redis.call('DEL', log_key, run_key, ledger_key, fence_key, queued_key, blobs_key, seal_key)
return {'ok'}
