-- Take a place for one console login attempt in a sliding window of failed ones
-- (console.login): refused while the window already holds `limit` failures, so that
-- however fast the attempts come, at most `limit` passwords are checked per window. The
-- attempt's place stays as its failure record; a successful login gives it back (ZREM).
--
-- KEYS[1] fails_key  dx:console:fails:<kind>:<who>  zset: member -> time of the attempt
--                                                   (ms); PX = the window, from the last
-- ARGV[1] now        the time (ms)
-- ARGV[2] window_ms  how long a failure counts (ms)
-- ARGV[3] limit      failures allowed within the window
-- ARGV[4] member     this attempt's member (unique)
-- Returns {1, 0} when the place is taken, {0, ms} when refused: ms until the oldest
-- failure leaves the window.

local fails_key = KEYS[1]
local now, window_ms = tonumber(ARGV[1]), tonumber(ARGV[2])
local limit, member = tonumber(ARGV[3]), ARGV[4]

-- A count of the version before the window (a string): dropped, the window starts empty.
if redis.call('TYPE', fails_key)['ok'] == 'string' then
  redis.call('DEL', fails_key)
end
redis.call('ZREMRANGEBYSCORE', fails_key, '-inf', now - window_ms)
if redis.call('ZCARD', fails_key) >= limit then
  local oldest = redis.call('ZRANGE', fails_key, 0, 0, 'WITHSCORES')
  return {0, math.max(tonumber(oldest[2]) + window_ms - now, 1)}
end
redis.call('ZADD', fails_key, now, member)
redis.call('PEXPIRE', fails_key, window_ms)
return {1, 0}
