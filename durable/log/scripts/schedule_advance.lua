-- Moves a schedule's next slot on from the one a sweep handled, unless it moved meanwhile
-- (another reconciler advanced it, or an operator paused or resumed the schedule): the
-- runs of the slots handled were started first, so a lost race skips nothing.
--
-- KEYS[1] next_key  dx:{schedules}:next  zset: name -> next slot not yet handled (ms)
-- ARGV[1] name      the schedule's name
-- ARGV[2] expected  the next slot the sweep read (ms)
-- ARGV[3] next_ms   the new next slot (ms), or "" to drop the entry
-- Returns 1 when moved, 0 when the entry was not at `expected` any more.

local next_key = KEYS[1]
local name, expected, next_ms = ARGV[1], ARGV[2], ARGV[3]

local current = redis.call('ZSCORE', next_key, name)
if not current or tonumber(current) ~= tonumber(expected) then return 0 end
if next_ms == '' then
  redis.call('ZREM', next_key, name)
else
  redis.call('ZADD', next_key, next_ms, name)
end
return 1
