-- Append a batch of events to one run's log: the only way run state changes.
-- One script so that the checks (expected version, lease, terminal state, pending cancel,
-- ledger claims) and every write that follows (log, projection, ledger, lease, indexes,
-- due set) happen atomically: a writer either lands its whole batch or nothing.
--
-- KEYS[1] log_key          dx:{R}:log       stream: the run's log
-- KEYS[2] run_key          dx:{R}:run       hash: the projection (version, state, step,
--                                           last, updated, cancel, ckpt, extra fields);
--                                           last = "<entry id> <chain head>" (below)
-- KEYS[3] lease_key        dx:{R}:lease     string "<token>|<epoch>"
-- KEYS[4] ledger_key       dx:{R}:fx        hash: idempotency key -> ledger entry
-- KEYS[5] runs_key         dx:runs          zset run id -> last update (global, derived)
-- KEYS[6] due_key          dx:due           zset run id -> due time (global, derived)
-- KEYS[7] old_index_key    dx:runs:<old>    zset of the state the writer folded from
-- KEYS[8] new_index_key    dx:runs:<new>    zset of new_state
-- KEYS[9] free_index_key   dx:runs:<free>   zset of free_state
-- KEYS[10] metrics_key     dx:metrics       hash: shared counters (global, not derived)
-- KEYS[11] blobs_key       dx:{R}:blobs     hash: the run's large values (durable.log.blobs)
-- KEYS[12] seal_key        dx:{R}:seal      string: the run's seal (seal.lua; only expired
--                                           here, with the run's other keys)
--
-- ARGV[1]  expected_version  the run's version the writer folded
-- ARGV[2]  lease             "<token>|<epoch>" that must hold the lease, or "" for no check
-- ARGV[3]  new_state         state after the batch
-- ARGV[4]  new_step          step after the batch
-- ARGV[5]  now               current time (ms)
-- ARGV[6]  due               "" leave the due set as is, "-" remove the run, else a time (ms)
-- ARGV[7]  checkpoint_pos    position (1-based) of a checkpoint event in the batch, 0 if none
-- ARGV[8]  flags             "d" the batch dispatches an effect (refused while a cancel is
--                            pending), "t" the batch may follow a terminal event (late
--                            reconciliation only), "r" release the writer's lease after the
--                            batch (its last write of a job), "q" the batch quarantines
--                            the run: written even after a foreign entry (see below),
--                            "v" the batch is to be sealed: the chain is checked first,
--                            from the last seal (or the first entry), "V" the same from
--                            the first entry (see below)
-- ARGV[9]  n                 number of events always appended
-- ARGV[10] m                 number of events appended after them only when no lease is held
-- ARGV[11] free_state        state after the batch when the m events are appended
-- ARGV[12] cancel            cancel pending after the batch: "1" or "0"
-- ARGV[13] run_id            the run id (member of the global zsets)
-- ARGV[14] nops              number of ledger ops
-- ARGV[15] nextra            number of extra projection fields
-- ARGV[16] lease_ttl_ms      the lease's time to live (ms): a write by the lease's holder
--                            renews it (a worker that writes is alive, even when its
--                            heartbeat thread waits for the interpreter)
-- ARGV[17] ncounts           number of counter increments for the n events
-- ARGV[18] nfree_counts      number of counter increments for the m conditional events
-- ARGV[19] retention_ms      "0" (expiries left as they are), or: once the run is terminal,
--                            its keys (log, projection, ledger, large values, seal) expire
--                            this many ms after its last
--                            write (DURABLE_RETENTION); the reconciler then prunes the global
--                            indexes and deletes the fence (not a KEY here: a producer's
--                            ACL user may not name it)
-- ARGV[20] nblobs            number of large values written with the events
-- ARGV[21] compact_max       once the run is terminal, a log of at most this many entries is
--                            rewritten to its exact size (DUMP + RESTORE: Redis keeps 4 KB
--                            ahead of need in a stream's newest node); skipped when this
--                            caller may not RESTORE (the shipped ACL users may not)
-- ARGV[22] ndrops            number of large values deleted with the events
-- then the variable-length groups, in this order (GROUP name, ARGV per item: what):
-- GROUP events       2  (ts, event): the n events, each with its time (ms), which is its
--                       entry id's time: "<ts>-<i>" (never before the log's last id)
-- GROUP free_events  2  (ts, event): the m conditional events, the same way
-- GROUP ops          3  (op, field, value) ledger ops: op "c" = claim (refused if the
--                       field exists), "p" = put; either way field is set to value
-- GROUP extras       2  (field, value) set on the projection
-- GROUP counts       2  (field, amount) increments of the metrics hash for the n events:
--                       a counter moves in the same call as the events it counts
--                       (durable.log.counters)
-- GROUP free_counts  2  (field, amount) the same, for the m conditional events
-- GROUP blobs        2  (field, value) large values of blobs_key: each is the result an
--                       outcome event of the batch refers to (by field, with its digest),
--                       written in the same call so that no outcome is ever in the log
--                       without its value
-- GROUP drops        1  (field): large values of blobs_key deleted, in the same call as the
--                       event that records their removal (context_trimmed,
--                       durable.log.context), so that none is ever gone unrecorded
-- (durable.log.append.AppendCall builds this call; a test checks it against this header.)
--
-- The log is hash-chained (durable.log.chain): each entry is written with "h", the first
-- byte of h_i modulo 128, h_i = SHA-1(hex(h_{i-1}) .. id .. "\n" .. event bytes), h_0 = SHA-1(
-- "durable-chain-v1\n" .. run id) (a run whose projection holds no head yet, written
-- before the chain existed, starts from h_0 too); the head (the full value after the last
-- entry) is kept in the projection's "last" with the entry id, so no entry is read back.
--
-- "v"/"V": before anything is written, the chain the log has is checked from the entry of
-- the last seal (dx:{R}:seal keeps its entry and the chain values before and after it: the
-- entry itself is checked too) or, without one, with "V", or when the batch ends a run of
-- at most compact_max entries, from the first entry, to the
-- head in the projection; a break is the reply, {"broken", entry id, why}, and nothing is
-- written (the caller quarantines the run). A checkpoint's entry has the chain value before
-- it kept in the projection's "ckh" ("<entry id> <value>"), where a load starts checking.
--
-- Returns {"ok", version, last_id, head, before, from, seal} (head: the chain after
-- last_id; before: the chain before it; from: where "v" started checking, "" for the first
-- entry; seal: the seal it started from, "" for none) or an error tuple:
-- {"conflict", actual} {"lease", holder} {"terminal", state} {"canceled"} {"claimed", f, v}
-- {"foreign", tail_id}: the log does not end with the entry this script wrote last (the
-- projection's "last"): something appended around it (a raw XADD). Nothing is written but
-- a quarantine ("q"), so that no writer builds on an entry nobody can vouch for. (Seen by
-- the log's length: a raw XADD balanced by an XDEL of another entry is not seen here, but
-- both break the chain, which verifying the log finds.)

local log_key, run_key, lease_key, ledger_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local runs_key, due_key = KEYS[5], KEYS[6]
local old_index_key, new_index_key, free_index_key = KEYS[7], KEYS[8], KEYS[9]

local expected_version, lease = tonumber(ARGV[1]), ARGV[2]
local new_state, new_step, now, due = ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local checkpoint_pos, flags = tonumber(ARGV[7]), ARGV[8]
local n, m, free_state = tonumber(ARGV[9]), tonumber(ARGV[10]), ARGV[11]
local cancel, run_id = ARGV[12], ARGV[13]
local nops, nextra = tonumber(ARGV[14]), tonumber(ARGV[15])
local lease_ttl_ms, retention_ms = ARGV[16], tonumber(ARGV[19])
local ncounts, nfree_counts = tonumber(ARGV[17]), tonumber(ARGV[18])
local metrics_key, blobs_key, seal_key = KEYS[10], KEYS[11], KEYS[12]
local nblobs, compact_max = tonumber(ARGV[20]), tonumber(ARGV[21])
local ndrops = tonumber(ARGV[22])

-- Where each variable-length group starts (the index just before its first entry).
local EVENTS_BASE = 22
local OPS_BASE = EVENTS_BASE + 2 * (n + m)
local EXTRAS_BASE = OPS_BASE + 3 * nops
local COUNTS_BASE = EXTRAS_BASE + 2 * nextra
local BLOBS_BASE = COUNTS_BASE + 2 * (ncounts + nfree_counts)
local DROPS_BASE = BLOBS_BASE + 2 * nblobs

-- Event i (1-based) of the batch: its time (ms) and its bytes.
local function event(i)
  local at = EVENTS_BASE + 2 * (i - 1)
  return tonumber(ARGV[at + 1]), ARGV[at + 2]
end

-- Ledger op i (1-based): op, field, value.
local function ledger_op(i)
  local at = OPS_BASE + 3 * (i - 1)
  return ARGV[at + 1], ARGV[at + 2], ARGV[at + 3]
end

-- Extra projection field i (1-based): field, value.
local function extra_field(i)
  local at = EXTRAS_BASE + 2 * (i - 1)
  return ARGV[at + 1], ARGV[at + 2]
end

-- Counter increment i (1-based): field, amount.
local function count_op(i)
  local at = COUNTS_BASE + 2 * (i - 1)
  return ARGV[at + 1], ARGV[at + 2]
end

-- Large value i (1-based): field, value.
local function blob(i)
  local at = BLOBS_BASE + 2 * (i - 1)
  return ARGV[at + 1], ARGV[at + 2]
end

local function has_flag(flag)
  return string.find(flags, flag, 1, true) ~= nil
end

-- Rendered from durable.log.state.TERMINAL when the script is loaded.
local TERMINAL = {--[[TERMINAL]]}

-- Checks: nothing is written until all of them pass.
local projection = redis.call('HMGET', run_key, 'version', 'state', 'cancel', 'last')
local version = tonumber(projection[1]) or 0
local old_state, cancel_was_pending = projection[2], projection[3] == '1'
-- "<entry id> <chain head>", or the id alone (written before the chain), or nothing.
local last_written, chain = projection[4], nil
if last_written then
  local space = string.find(last_written, ' ', 1, true)
  if space then
    chain = string.sub(last_written, space + 1)
    last_written = string.sub(last_written, 1, space - 1)
  end
end
if version ~= expected_version then
  return {'conflict', version}
end
-- The log's last entry: the projection's "last" while the log holds exactly the entries
-- this script counted (XLEN is O(1); XREVRANGE decodes an entry and builds its reply),
-- else read from the log itself (a log written before the chain, or changed around this
-- script: its tail is then checked below). pcall: an ACL file from before this script
-- used XLEN refuses it, and the tail is then read as it was.
local tail_id
if redis.pcall('XLEN', log_key) == version and (version == 0 or (last_written or '') ~= '') then
  tail_id = version == 0 and '' or last_written
else
  local tail = redis.call('XREVRANGE', log_key, '+', '-', 'COUNT', 1)
  tail_id = tail[1] and tail[1][1] or ''
end
if last_written and last_written ~= '' and not has_flag('q') and tail_id ~= ''
    and tail_id ~= last_written then
  return {'foreign', tail_id}
end
if lease ~= '' then
  local holder = redis.call('GET', lease_key)
  if holder ~= lease then
    return {'lease', holder or ''}
  end
end
if old_state and TERMINAL[old_state] and not has_flag('t') then
  return {'terminal', old_state}
end
-- Defense in depth: a batch that dispatches while a cancel is still pending after it
-- (the writer did not consume the cancel) is refused.
if has_flag('d') and cancel_was_pending and cancel == '1' then
  return {'canceled'}
end
for i = 1, nops do
  local op, field = ledger_op(i)
  if op == 'c' then
    local existing = redis.call('HGET', ledger_key, field)
    if existing then
      return {'claimed', field, existing}
    end
  end
end

-- The chain checked before a seal ("v", "V"): from the last seal's entry, or the first.
local checked_from, anchor_seal = '', ''
if (has_flag('v') or has_flag('V')) and not has_flag('q') then
  local start, value, sealed_head = '-', nil, nil
  local sealed = redis.call('GET', seal_key)
  -- A run that ends with a short log is checked whole, as it is rewritten whole (below).
  local whole = has_flag('V') or (TERMINAL[new_state] and version + n <= compact_max)
  if sealed and not whole then
    local decoded, s = pcall(cjson.decode, sealed)
    if decoded and type(s) == 'table' and type(s.entry) == 'string' and
        type(s.before) == 'string' and type(s.head) == 'string' and s.head ~= '' then
      start, value, sealed_head = s.entry, s.before, s.head
      checked_from, anchor_seal = s.entry, sealed
    end
  end
  local h, walked = value, ''
  for index, entry in ipairs(redis.call('XRANGE', log_key, start, '+')) do
    local id, f = entry[1], entry[2]
    if index == 1 and start ~= '-' and id ~= start then
      return {'broken', start, 'is missing (the last seal covers it): it was removed'}
    end
    local data, carried = '', nil
    for j = 1, #f, 2 do
      if f[j] == 'e' then data = f[j + 1] elseif f[j] == 'h' then carried = f[j + 1] end
    end
    if carried then
      h = redis.sha1hex((h or redis.sha1hex('durable-chain-v1\n' .. run_id)) .. id .. '\n' .. data)
      if tonumber(carried) ~= tonumber(string.sub(h, 1, 2), 16) % 128 then
        return {'broken', id, 'does not chain to the entry before it: it was changed, or an ' ..
          'entry was removed, added or moved'}
      end
      if index == 1 and sealed_head and h ~= sealed_head then
        return {'broken', id, 'does not end the chain its seal signed: it was changed'}
      end
    elseif h then
      return {'broken', id, 'carries no chain link: it was written around the append script'}
    end
    walked = id
  end
  local expected_last = (last_written and last_written ~= '') and last_written or walked
  if walked ~= expected_last or h ~= chain then
    return {'broken', expected_last, 'ends a chain that does not reach the head ' ..
      'recorded after it: an entry was changed and the links after it recomputed, or the ' ..
      'head was changed'}
  end
end

-- The m conditional events go in only when no lease is held.
local count = n
local counted = ncounts
if m > 0 and redis.call('EXISTS', lease_key) == 0 then
  count = n + m
  counted = ncounts + nfree_counts
  new_state = free_state
  new_index_key = free_index_key
end

-- Writes.
-- Each entry's id is its writer's time, so the entry need not carry it; never before the
-- log's last id (another writer's clock may be ahead).
local last_ms, last_seq = -1, -1
if tail_id ~= '' then
  local dash = string.find(tail_id, '-', 1, true)
  last_ms = tonumber(string.sub(tail_id, 1, dash - 1))
  last_seq = tonumber(string.sub(tail_id, dash + 1))
end
local last_id, ckpt_id, ckpt_chain, before = '', nil, nil, ''
chain = chain or redis.sha1hex('durable-chain-v1\n' .. run_id)
-- Append one entry, chained. Returns false when XADD refused it (its id is not past the
-- stream's top), unless "strict": then the refusal is raised.
local function chained(id, data, strict)
  local link = redis.sha1hex(chain .. id .. '\n' .. data)
  local tag = tonumber(string.sub(link, 1, 2), 16) % 128
  if strict then
    redis.call('XADD', log_key, id, 'e', data, 'h', tag)
  elseif type(redis.pcall('XADD', log_key, id, 'e', data, 'h', tag)) == 'table' then
    return false
  end
  chain = link
  return true
end
for i = 1, count do
  local ms, data = event(i)
  if ms < last_ms then
    ms = last_ms
  end
  local seq = 0
  if ms == last_ms then
    seq = last_seq + 1
  end
  last_id = string.format('%d-%d', ms, seq)
  before = chain
  if not chained(last_id, data) then
    -- Entries were deleted past the tail (XDEL by an admin): the entry goes right after
    -- the stream's top id (XINFO names it); a caller refused XINFO appends with the
    -- server's id and time, and that entry carries no link (verify names it).
    local info = redis.pcall('XINFO', 'STREAM', log_key)
    local top
    if type(info) == 'table' and not info.err then
      for j = 1, #info, 2 do
        if info[j] == 'last-generated-id' then
          top = info[j + 1]
        end
      end
    end
    if top then
      local dash = string.find(top, '-', 1, true)
      ms, seq = tonumber(string.sub(top, 1, dash - 1)), tonumber(string.sub(top, dash + 1)) + 1
      last_id = string.format('%d-%d', ms, seq)
      chained(last_id, data, true)
    else
      last_id = redis.call('XADD', log_key, '*', 'e', data)
      local dash = string.find(last_id, '-', 1, true)
      ms, seq = tonumber(string.sub(last_id, 1, dash - 1)), tonumber(string.sub(last_id, dash + 1))
    end
  end
  last_ms, last_seq = ms, seq
  if i == checkpoint_pos then
    ckpt_id, ckpt_chain = last_id, before
  end
end
-- One HSET per key, its fields in the order separate calls would have set them (in parts
-- of at most 1,000 values: Lua's unpack is bounded by its stack).
local function call_with(command, key, values, from, to)
  for lo = from, to, 1000 do
    redis.call(command, key, unpack(values, lo, math.min(lo + 999, to)))
  end
end
if nops > 0 then
  local pairs_ = {}
  for i = 1, nops do
    local _, field, value = ledger_op(i)
    pairs_[2 * i - 1], pairs_[2 * i] = field, value
  end
  call_with('HSET', ledger_key, pairs_, 1, 2 * nops)
end
call_with('HSET', blobs_key, ARGV, BLOBS_BASE + 1, BLOBS_BASE + 2 * nblobs)
call_with('HDEL', blobs_key, ARGV, DROPS_BASE + 1, DROPS_BASE + ndrops)
local new_version = version + count
local projected = {}
if ckpt_id then
  projected = {'ckpt', ckpt_id, 'ckh', ckpt_id .. ' ' .. ckpt_chain}
end
local at = #projected
projected[at + 1], projected[at + 2] = 'version', new_version
projected[at + 3], projected[at + 4] = 'state', new_state
projected[at + 5], projected[at + 6] = 'step', new_step
projected[at + 7], projected[at + 8] = 'updated', now
projected[at + 9], projected[at + 10] = 'cancel', cancel
at = at + 10
if last_id ~= '' then  -- (a call that appends nothing leaves the tail as it is)
  projected[at + 1], projected[at + 2] = 'last', last_id .. ' ' .. chain
  at = at + 2
end
for i = 1, nextra do
  projected[at + 1], projected[at + 2] = extra_field(i)
  at = at + 2
end
redis.call('HSET', run_key, unpack(projected))
for i = 1, counted do
  local field, amount = count_op(i)
  redis.call('HINCRBY', metrics_key, field, amount)
end

if old_state and old_state ~= new_state then
  redis.call('ZREM', old_index_key, run_id)
end
redis.call('ZADD', new_index_key, now, run_id)
redis.call('ZADD', runs_key, now, run_id)
if lease ~= '' and has_flag('r') then
  redis.call('DEL', lease_key)
  redis.call('HDEL', run_key, 'held')
elseif lease ~= '' then
  redis.call('PEXPIRE', lease_key, lease_ttl_ms)
end
if due == '-' then
  redis.call('ZREM', due_key, run_id)
elseif due ~= '' then
  redis.call('ZADD', due_key, due, run_id)
end
if TERMINAL[new_state] and new_version <= compact_max then
  local dumped = redis.pcall('DUMP', log_key)
  if type(dumped) == 'string' then
    local ttl = redis.call('PTTL', log_key)  -- kept: an append may leave the expiry as it is
    redis.pcall('RESTORE', log_key, ttl > 0 and ttl or 0, dumped, 'REPLACE')
  end
end
if retention_ms > 0 and TERMINAL[new_state] then
  redis.call('PEXPIRE', log_key, retention_ms)
  redis.call('PEXPIRE', run_key, retention_ms)
  redis.call('PEXPIRE', ledger_key, retention_ms)
  redis.call('PEXPIRE', blobs_key, retention_ms)
  redis.call('PEXPIRE', seal_key, retention_ms)
end
return {'ok', new_version, last_id, chain, before, checked_from, anchor_seal}
