-- Give back one call's permit of one limiter, settle the tokens it used, lower the
-- limiter's rate when the provider answered 429, and name the oldest waiter to wake.
-- The keys are limit_take.lua's (one hash tag {limit:<name>:<key>}: one slot).
--
-- KEYS[1] inflight  zset permit -> expiry (ms)
-- KEYS[2] used      hash permit -> tokens
-- KEYS[3] state     hash tokens (the sum of used), factor, lowered, until, throttled
-- KEYS[4] waiting   zset run id -> when it began to wait (ms)
--
-- ARGV[1] permit       "<run>:<step>:<attempt>"
-- ARGV[2] now          ms
-- ARGV[3] tokens       what the call used (its reply's usage), or -1: keep the estimate
-- ARGV[4] retry_after  ms the provider asked to wait (a 429), or 0
-- ARGV[5] wake         "1": pop the oldest waiter (a limit on calls in flight)
-- ARGV[6] period       ms (as limit_take.lua's)
-- ARGV[7] recover      as limit_take.lua's
-- ARGV[8] floor        the lowest share of the declared rate a 429 may lower it to
--
-- Returns the run id to wake, or "".

local inflight, used, state, waiting = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local permit, now = ARGV[1], tonumber(ARGV[2])
local spent, retry_after = tonumber(ARGV[3]), tonumber(ARGV[4])
local wake, period = ARGV[5], tonumber(ARGV[6])
local recover, floor = tonumber(ARGV[7]), tonumber(ARGV[8])

redis.call('ZREM', inflight, permit)
local reserved = redis.call('HGET', used, permit)
if spent >= 0 and reserved then
  redis.call('HSET', used, permit, spent)
  redis.call('HINCRBY', state, 'tokens', spent - tonumber(reserved))
end
if retry_after > 0 then
  local s = redis.call('HMGET', state, 'factor', 'lowered', 'until')
  local factor = tonumber(s[1]) or 1
  local lowered, hold = tonumber(s[2]) or 0, tonumber(s[3]) or 0
  if factor < 1 then
    factor = math.min(1, factor + recover * math.max(0, math.floor((now - lowered) / period)))
  end
  -- Multiplicative decrease, once per Retry-After: the answers of the other calls in
  -- flight at the time of the first 429 do not lower it again.
  if now >= hold then
    -- It regains its share period by period from the end of the hold.
    redis.call('HSET', state, 'factor', math.max(floor, factor / 2), 'lowered',
               now + retry_after)
  end
  redis.call('HSET', state, 'until', math.max(hold, now + retry_after))
  redis.call('HINCRBY', state, 'throttled', 1)
end
if wake == '1' then
  local first = redis.call('ZPOPMIN', waiting)
  if #first > 0 then return first[1] end
end
return ''
