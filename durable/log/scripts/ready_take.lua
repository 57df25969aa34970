-- Take up to `count` ready runs of a route: from its fair side (durable.flow.fairness) and its
-- plain list (runs with no tenant and priority 0, and those made ready before fairness),
-- in turn. A fair run prioritized ahead of the current round goes first.
--
-- KEYS[1] list   the route's ready list (LPOP order)
-- KEYS[2] runs   zset run id -> score (ready_push.lua)
-- KEYS[3] clock  hash "~v" virtual time, "~turn" "l" when the list gave the last run
-- KEYS[4] prio   hash run id -> priority
--
-- ARGV[1] count  how many ("" for one: the reply is then a run id or nil, as LPOP's)
-- ARGV[2] aging  as ready_push.lua's
--
-- Returns the run ids taken, oldest turn first (as LPOP key count: nil when none).

local list, runs, clock, prio = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local one = ARGV[1] == ''
local count = one and 1 or tonumber(ARGV[1])
local aging = tonumber(ARGV[2])
-- A route whose fair side was never used (no clock, no fair run: no run of it had a tenant
-- or a priority) is a plain list: LPOP it, as the loop below would, one call instead of a
-- call per run and the clock's reads.
if redis.call('ZCARD', runs) == 0 and redis.call('EXISTS', clock) == 0 then
  if one then return redis.call('LPOP', list) end
  return redis.call('LPOP', list, count)
end
local v = tonumber(redis.call('HGET', clock, '~v')) or 0
local turn = redis.call('HGET', clock, '~turn')
local out = {}
local fair_left = redis.call('ZCARD', runs)
while #out < count do
  local from_list = false
  if fair_left == 0 then
    from_list = true
  else
    local head = redis.call('ZRANGE', runs, 0, 0, 'WITHSCORES')
    if tonumber(head[2]) > v and turn ~= 'l' then from_list = true end
  end
  if from_list then
    local run = redis.call('LPOP', list)
    if not run then
      if fair_left == 0 then break end
      from_list = false
    else
      out[#out + 1] = run
      turn = 'l'
    end
  end
  if not from_list then
    local head = redis.call('ZPOPMIN', runs)
    local run, score = head[1], tonumber(head[2])
    local p = tonumber(redis.call('HGET', prio, run)) or 0
    if p ~= 0 then redis.call('HDEL', prio, run) end
    v = math.max(v, score + p * aging)
    fair_left = fair_left - 1
    out[#out + 1] = run
    turn = 'f'
  end
end
if fair_left > 0 or redis.call('EXISTS', clock) == 1 then
  redis.call('HSET', clock, '~v', v, '~turn', turn or 'f')
end
if #out == 0 then return false end
if one then return out[1] end
return out
