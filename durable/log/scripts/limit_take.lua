-- Take a permit of one limiter (one limit, one key) for one call, or say when to ask again.
-- One script per decision, so that every worker obeys the same count: the checks and the
-- grant happen atomically. Every key below shares the hash tag {limit:<name>:<key>}: one
-- slot, on a Redis Cluster too.
--
-- KEYS[1] inflight  zset permit -> expiry (ms): the calls in flight. A permit past its
--                   expiry (its holder died without releasing it) is dropped here: a
--                   SIGKILLed worker leaks nothing for longer than the call's deadline
-- KEYS[2] calls     zset "<permit>@<ms>" -> grant time (ms): the grants of the last period
-- KEYS[3] tokens    zset permit -> grant time (ms): the model calls of the last period
-- KEYS[4] used      hash permit -> tokens: reserved (the estimate), then settled (usage)
-- KEYS[5] state     hash tokens (the sum of used), factor (adaptive share of the declared rate, 0-1), lowered (ms of
--                   the end of the last lowering's hold), until (ms: nothing is granted before it, the
--                   provider's Retry-After), granted, waited, throttled (counts)
-- KEYS[6] waiting   zset run id -> when it began to wait (ms): the calls waiting, oldest
--                   first (a release wakes the oldest)
--
-- ARGV[1]  now         ms
-- ARGV[2]  permit      "<run>:<step>:<attempt>": the same dispatch taken again is granted again
-- ARGV[3]  expires     ms: when the permit lapses if never released (the call's deadline)
-- ARGV[4]  run         the run id (a member of waiting)
-- ARGV[5]  in_flight   at most this many permits at once (0: no bound)
-- ARGV[6]  rate        at most this many grants per period (0: no bound)
-- ARGV[7]  tokens      at most this many tokens per period (0: no bound)
-- ARGV[8]  period      ms (rate and tokens), counted with the margin below
-- ARGV[9]  estimate    tokens this call reserves
-- ARGV[10] recover     share of the declared rate regained per period without a 429
-- ARGV[11] idle_ms     the keys expire this long after the last decision
--
-- Returns {1, 0, ""} (granted; {1, 1, ""} when the run had been waiting) or
-- {0, retry_at_ms, why}: refused; the run is added to waiting and asks again at retry_at
-- (a release may wake it sooner).

local inflight, calls, tokens, used = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local state, waiting = KEYS[5], KEYS[6]
local now, permit, expires, run = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3]), ARGV[4]
local in_flight, rate, max_tokens = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local period, estimate, recover = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local idle_ms = tonumber(ARGV[11])

-- What has lapsed: permits of dead holders, grants and tokens older than the period.
redis.call('ZREMRANGEBYSCORE', inflight, '-inf', now)
redis.call('ZREMRANGEBYSCORE', calls, '-inf', now - period)
local old = redis.call('ZRANGEBYSCORE', tokens, '-inf', now - period)
if #old > 0 then
  redis.call('ZREMRANGEBYSCORE', tokens, '-inf', now - period)
  local gone = 0
  for i = 1, #old, 1000 do
    local part = {unpack(old, i, math.min(i + 999, #old))}
    for _, v in ipairs(redis.call('HMGET', used, unpack(part))) do
      gone = gone + (tonumber(v) or 0)
    end
    redis.call('HDEL', used, unpack(part))
  end
  redis.call('HINCRBY', state, 'tokens', -gone)
end

local function touch()
  for _, key in ipairs(KEYS) do redis.call('PEXPIRE', key, idle_ms) end
end

-- The same call again (a retry of the dispatch commit): it holds its permit already.
if redis.call('ZSCORE', inflight, permit) then
  redis.call('ZADD', inflight, expires, permit)
  touch()
  return {1, 0, ''}
end

local s = redis.call('HMGET', state, 'factor', 'lowered', 'until')
local factor = tonumber(s[1]) or 1
local lowered, hold = tonumber(s[2]) or 0, tonumber(s[3]) or 0
if factor < 1 then  -- additive increase: back towards the declared rate, period by period
  -- after the hold ("lowered" is when the hold of the last lowering ended)
  factor = math.min(1, factor + recover * math.max(0, math.floor((now - lowered) / period)))
end

local place = redis.call('ZRANK', waiting, run)
if not place then place = redis.call('ZCARD', waiting) end
local retry, why = 0, ''
local function later(at, reason)
  if at > retry then retry, why = at, reason end
end

if now < hold then later(hold, 'the provider asked to wait (Retry-After)') end
if in_flight > 0 then
  local n = redis.call('ZCARD', inflight)
  if n >= in_flight then  -- a release wakes the oldest waiter; else the first expiry
    local first = redis.call('ZRANGE', inflight, 0, 0, 'WITHSCORES')
    later(math.min(tonumber(first[2]), now + 5000) + place, in_flight .. ' in flight')
  end
end
if rate > 0 then
  local allowed = math.max(1, math.floor(rate * factor))
  local n = redis.call('ZCARD', calls)
  if n >= allowed then
    -- Staggered: the waiter at `place` is due when the grant that makes room for it
    -- leaves the window, not all waiters at once.
    local k = n - allowed + place
    local at = redis.call('ZRANGE', calls, k % n, k % n, 'WITHSCORES')
    later(tonumber(at[2]) + period * (math.floor(k / n) + 1), allowed .. ' per period')
  end
end
if max_tokens > 0 then
  local allowed = math.max(1, math.floor(max_tokens * factor))
  local total = tonumber(redis.call('HGET', state, 'tokens')) or 0
  if total > 0 and total + estimate > allowed then
    -- Over: when will enough of the period's tokens have left it? (Walked only now.)
    local members = redis.call('ZRANGE', tokens, 0, -1, 'WITHSCORES')
    local amounts = {}
    for i = 1, #members, 2 do
      amounts[#amounts + 1] = tonumber(redis.call('HGET', used, members[i])) or 0
    end
    local need = total + estimate * (place + 1) - allowed
    local freed, at = 0, now + period
    for i = 1, #amounts do
      freed = freed + amounts[i]
      if freed >= need then at = tonumber(members[2 * i]) + period break end
    end
    later(at, allowed .. ' tokens per period')
  end
end

if retry > 0 then
  redis.call('ZADD', waiting, 'NX', now, run)
  redis.call('HINCRBY', state, 'waited', 1)
  touch()
  return {0, retry, why}
end

redis.call('ZADD', inflight, expires, permit)
if rate > 0 then redis.call('ZADD', calls, now, permit .. '@' .. now) end
if max_tokens > 0 then
  redis.call('ZADD', tokens, now, permit)
  redis.call('HSET', used, permit, estimate)
  redis.call('HINCRBY', state, 'tokens', estimate)
end
if factor >= 1 and s[1] then redis.call('HDEL', state, 'factor', 'lowered') end
redis.call('HINCRBY', state, 'granted', 1)
local was = redis.call('ZREM', waiting, run)
touch()
return {1, was, ''}
