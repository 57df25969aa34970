-- Append a batch of events to one run's log: the only way run state changes.
--
-- KEYS[1] log stream          dx:{R}:log
-- KEYS[2] projection hash     dx:{R}:run
-- KEYS[3] lease string        dx:{R}:lease
-- KEYS[4] ledger hash         dx:{R}:fx
-- KEYS[5] runs by update      dx:runs            (global, derived)
-- KEYS[6] due set             dx:due             (global, derived)
-- KEYS[7] old state's index   dx:runs:<old>      (global, derived)
-- KEYS[8] new state's index   dx:runs:<new>
-- KEYS[9] index of state_if_free
--
-- ARGV[1]  expected version (the run's version the writer folded)
-- ARGV[2]  lease value "<token>|<epoch>" that must hold the lease, or "" for no check
-- ARGV[3]  new state            ARGV[4]  new step          ARGV[5]  now (ms)
-- ARGV[6]  due: "" leave as is, "-" remove, else a time in ms
-- ARGV[7]  position (1-based) of a checkpoint event in the batch, 0 if none
-- ARGV[8]  flags: "d" the batch dispatches an effect (refused while a cancel is pending),
--                 "t" the batch may follow a terminal event (late reconciliation only)
--                 "r" release the writer's lease after the batch (its last write of a job)
-- ARGV[9]  n: events always appended
-- ARGV[10] m: events appended after them only when no lease is held
-- ARGV[11] state when the m events are appended
-- ARGV[12] cancel pending after the batch: "1" or "0"
-- ARGV[13] run id
-- ARGV[14] number of ledger ops, ARGV[15] number of extra projection fields
-- then n + m encoded events, then ledger ops as (op, field, value) with op "c" = claim
-- (refused if the field exists) or "p" = put, then extra (field, value) pairs.
--
-- Returns {"ok", version, last_id} or an error tuple:
-- {"conflict", actual} {"lease", holder} {"terminal", state} {"canceled"} {"claimed", f, v}

local TERMINAL = {completed = true, failed = true, canceled = true, expired = true}

local proj = redis.call('HMGET', KEYS[2], 'version', 'state', 'cancel')
local version = tonumber(proj[1]) or 0
if version ~= tonumber(ARGV[1]) then
  return {'conflict', version}
end
if ARGV[2] ~= '' then
  local holder = redis.call('GET', KEYS[3])
  if holder ~= ARGV[2] then
    return {'lease', holder or ''}
  end
end
local flags = ARGV[8]
if proj[2] and TERMINAL[proj[2]] and not string.find(flags, 't', 1, true) then
  return {'terminal', proj[2]}
end
-- Defense in depth: a batch that dispatches while a cancel is still pending after it
-- (the writer did not consume the cancel) is refused.
if string.find(flags, 'd', 1, true) and proj[3] == '1' and ARGV[12] == '1' then
  return {'canceled'}
end

local n = tonumber(ARGV[9])
local m = tonumber(ARGV[10])
local nops = tonumber(ARGV[14])
local nextra = tonumber(ARGV[15])
local base = 15
local opbase = base + n + m
for i = 0, nops - 1 do
  local op = ARGV[opbase + 3 * i + 1]
  if op == 'c' then
    local field = ARGV[opbase + 3 * i + 2]
    local existing = redis.call('HGET', KEYS[4], field)
    if existing then
      return {'claimed', field, existing}
    end
  end
end

local new_state = ARGV[3]
local new_index = KEYS[8]
local count = n
if m > 0 and redis.call('EXISTS', KEYS[3]) == 0 then
  count = n + m
  new_state = ARGV[11]
  new_index = KEYS[9]
end

local last_id = ''
local ckpt = tonumber(ARGV[7])
for i = 1, count do
  last_id = redis.call('XADD', KEYS[1], '*', 'e', ARGV[base + i])
  if i == ckpt then
    redis.call('HSET', KEYS[2], 'ckpt', last_id)
  end
end
for i = 0, nops - 1 do
  redis.call('HSET', KEYS[4], ARGV[opbase + 3 * i + 2], ARGV[opbase + 3 * i + 3])
end
local new_version = version + count
local now = ARGV[5]
redis.call('HSET', KEYS[2], 'version', new_version, 'state', new_state, 'step', ARGV[4],
  'last', last_id, 'updated', now, 'cancel', ARGV[12])
local xbase = opbase + 3 * nops
for i = 0, nextra - 1 do
  redis.call('HSET', KEYS[2], ARGV[xbase + 2 * i + 1], ARGV[xbase + 2 * i + 2])
end

local run_id = ARGV[13]
if proj[2] and proj[2] ~= new_state then
  redis.call('ZREM', KEYS[7], run_id)
end
redis.call('ZADD', new_index, now, run_id)
redis.call('ZADD', KEYS[5], now, run_id)
if ARGV[2] ~= '' and string.find(flags, 'r', 1, true) then
  redis.call('DEL', KEYS[3])
end
local due = ARGV[6]
if due == '-' then
  redis.call('ZREM', KEYS[6], run_id)
elseif due ~= '' then
  redis.call('ZADD', KEYS[6], due, run_id)
end
return {'ok', new_version, last_id}
