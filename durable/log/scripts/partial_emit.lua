-- Keep one partial output of a step in flight, bounded, and publish it to the followers.
-- One script so that what a late follower reads (the kept list) and what it hears (the
-- channel) never disagree: a message is kept before it is published, and a follower that
-- subscribed first, then read the list, misses none (it drops what it read twice by seq).
--
-- KEYS[1] index_key  dx:{R}:partials      hash: step -> bytes kept for it; PX ttl_ms
-- KEYS[2] list_key   dx:{R}:partial:<step> list: the step's messages, oldest first; PX ttl_ms
-- ARGV[1] step       the step number (the index's field)
-- ARGV[2] message    the encoded message ({"run", "step", "attempt", "seq", "data"})
-- ARGV[3] first      "1" for the first message of a dispatch: the list is emptied first
-- ARGV[4] keep_bytes most bytes kept per step: the oldest messages are dropped beyond it
-- ARGV[5] ttl_ms     expiry of both keys, renewed at each message (a crashed call's leftovers)
-- ARGV[6] channel    dx:{R}:stream, the pub/sub channel
-- Returns the number of messages kept for the step.

local index_key, list_key = KEYS[1], KEYS[2]
local step, message, first = ARGV[1], ARGV[2], ARGV[3]
local keep_bytes, ttl_ms, channel = tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6]

if first == '1' then
  redis.call('DEL', list_key)
  redis.call('HSET', index_key, step, 0)
end
local n = redis.call('RPUSH', list_key, message)
local kept = redis.call('HINCRBY', index_key, step, #message)
while kept > keep_bytes and n > 1 do
  local dropped = redis.call('LPOP', list_key)
  kept = redis.call('HINCRBY', index_key, step, -#dropped)
  n = n - 1
end
redis.call('PEXPIRE', list_key, ttl_ms)
redis.call('PEXPIRE', index_key, ttl_ms)
redis.call('PUBLISH', channel, message)
return n
