-- Take (or re-take) a run's lease with a new fencing epoch and, in the same round trip,
-- read what recovery needs: the projection's version and the log from the last checkpoint.
-- Workers and the reconciler both start their work on a run with this script.
--
-- KEYS[1] lease_key   dx:{R}:lease   string "<token>|<epoch>", PX ttl_ms
-- KEYS[2] fence_key   dx:{R}:fence   counter: grows on every acquisition
-- KEYS[3] queued_key  dx:{R}:queued  marker: a command for the run is queued
-- KEYS[4] log_key     dx:{R}:log     stream: the run's log
-- KEYS[5] run_key     dx:{R}:run     hash: the projection (version, ckpt, held)
-- KEYS[6] seal_key    dx:{R}:seal    string: the run's seal (read: a load checks the chain)
-- KEYS[7] region_key  dx:region      hash of the run's shard (owner, epoch, state): given
--                                    only with a region (ARGV[4]); in the run's slot
-- ARGV[1] token        the owner token (a worker or reconciler id)
-- ARGV[2] ttl_ms       the lease's time to live (ms)
-- ARGV[3] take_queued  "1": drop the queued marker first (a worker starting a command),
--                      so a new enqueue is not a duplicate; "0": leave it
-- ARGV[4] region       this process's region; "" or absent: regions are off, no check
--
-- With a region, the lease is taken only while region_key names that region as owner and
-- its state is "active" (durable.backend.regions); otherwise the reply is {"region",
-- owner, epoch, state} and nothing is written. A shard no region claimed yet is claimed
-- for this one (epoch 1): on a fresh database the first region to work owns it.
--
-- The projection's "held" field names the lease taken last and is cleared when it is
-- released (lease_release.lua, append.lua's "r" flag): a new lease taken while "held" is
-- still set means the last one expired (its holder died or stalled), and the reply says so
-- (the caller counts it: this script touches one run's keys only).
-- Returns {"busy", holder, pttl} while another owner holds the lease, else
-- {"ok", lease value, version, entries, expired, last, ckpt, ckh, seal}: version 0 and no
-- entries when the run is unknown; expired 1 when the lease taken before this one expired
-- instead of being released; last, ckpt, ckh: the projection's (the chain head, the last
-- checkpoint's entry and the chain value before it, "" when absent), seal: the run's seal
-- ("" when none): what a load checks the entries' chain against (durable.log.chain).

local lease_key, fence_key, queued_key = KEYS[1], KEYS[2], KEYS[3]
local log_key, run_key = KEYS[4], KEYS[5]
local token, ttl_ms, take_queued = ARGV[1], ARGV[2], ARGV[3]
local region = ARGV[4] or ''

if region ~= '' then
  local region_key = KEYS[7]
  local owned = redis.call('HMGET', region_key, 'owner', 'epoch', 'state')
  if not owned[1] then
    redis.call('HSET', region_key, 'owner', region, 'epoch', 1, 'state', 'active')
    owned = {region, '1', 'active'}
  end
  if owned[1] ~= region or owned[3] ~= 'active' then
    return {'region', owned[1], tonumber(owned[2]) or 0, owned[3] or ''}
  end
end
if take_queued == '1' then
  redis.call('DEL', queued_key)
end
local holder = redis.call('GET', lease_key)
local value
if holder then
  if string.sub(holder, 1, string.len(token) + 1) ~= token .. '|' then
    return {'busy', holder, redis.call('PTTL', lease_key)}
  end
  value = holder
  redis.call('PEXPIRE', lease_key, ttl_ms)
else
  local epoch = redis.call('INCR', fence_key)
  value = token .. '|' .. epoch
  redis.call('SET', lease_key, value, 'PX', ttl_ms)
end
local projection = redis.call('HMGET', run_key, 'version', 'ckpt', 'held', 'last', 'ckh')
local version, checkpoint_id, held = projection[1], projection[2], projection[3]
if not version then
  return {'ok', value, 0, {}, 0}
end
local expired = 0
if held ~= value then
  if held then
    expired = 1
  end
  redis.call('HSET', run_key, 'held', value)
end
return {'ok', value, tonumber(version), redis.call('XRANGE', log_key, checkpoint_id or '-', '+'),
  expired, projection[4] or '', checkpoint_id or '', projection[5] or '',
  redis.call('GET', KEYS[6]) or ''}
