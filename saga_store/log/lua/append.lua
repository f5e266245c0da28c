-- APPEND: compare-and-set a chain's head, check lease and phase, add events.
--
-- Redis Lua has no SHA-256, so hashes come from the client; this script only
-- compares and sets. It touches the keys of one chain, all under one hash tag
-- (one Cluster slot).
--
-- KEYS[1] chain log stream      KEYS[2] chain meta hash      KEYS[3] lease key
-- KEYS[4 ..] the keys of the side writes (same hash tag)
-- ARGV[1] expected head seq (-1 for an empty chain)
-- ARGV[2] expected head hash (32 raw bytes; empty for an empty chain)
-- ARGV[3] lease token ('' = no lease check)
-- ARGV[4] lease mode: 'hold'    KEYS[3] must hold the token
--                     'acquire' take KEYS[3] if free or ours, for ARGV[5] ms
--                     'release' KEYS[3] must hold the token; expired after
-- ARGV[5] lease time to live in ms (for 'acquire'; Redis's clock, relative)
-- ARGV[6] phase: 'open'  the append creates the chain (it must not exist);
--                ''      any phase but closed;
--                other   the meta's phase must be this one (missing = forward).
--         Only an opening creates a chain: any other append to a chain that
--         does not exist is refused. A saga whose phase is 'closed' (it has its
--         final event) takes no append at all.
--         The phase is read from the log: every entry carries, in its 'p'
--         field, the phase the chain is in after it (the verifier checks each
--         against the event kinds). Only a chain written before entries carried
--         it falls back to the meta hash, which is otherwise a cache for readers.
-- ARGV[7] n, the number of events
-- ARGV[8 .. 7+3n] body, hash and phase after it ('' = unchanged) of each event
-- ARGV[m = 8+3n] k, then k field/value pairs written to meta after the append
-- ARGV[m+1+2k] s, then s side writes, each: op, key index (into KEYS), argc,
--         args. ops: 'hset' (field/value pairs), 'set' (value), 'pexpire' (ms),
--         'trim' (LTRIM the first n items off: the ledger's pending entries the
--         events came from), 'absent' (no write: a guard, the append is refused
--         if the key exists); and, for the indexes a saga is listed in (layout 3
--         puts them under the saga's bucket's hash tag): 'zadd' (member, score,
--         flags: 'r' the score is ms from now by Redis's clock, 'n' keep a score
--         already set), 'zrem', 'sadd', 'srem' (a member) and 'rpush' (a value;
--         the list's length after it is the reply's fourth item). Side writes
--         happen only when the append does, so a refused append writes nothing.
-- returns {1, new head seq, '', pushed}    appended (pushed: the length of the
--                                          last 'rpush' list, 0 if none)
--         {0, head seq, head hash}         head moved: re-read, decide again (or
--                                          it is this append, resent: the only
--                                          write then is the meta's seq, as is;
--                                          with a lease to hold or take, not
--                                          while another token holds it)
--         {-1, 0, holder}                  lease held by another token (fenced off)
--         {-2, 0, phase}                   saga is in another phase
--         {-3, 0, ''}                      no such chain, and this is no opening
--         {-4, 0, key}                     a guard's key exists
local unpack = unpack or table.unpack
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
local seq, head, phase = -1, '', nil
if last[1] then
  seq = tonumber(string.match(last[1][1], '^0%-(%d+)$') or '0') - 1
  local f = last[1][2]
  for i = 1, #f, 2 do
    if f[i] == 'h' then head = f[i + 1] elseif f[i] == 'p' then phase = f[i + 1] end
  end
end
local want = ARGV[6]
if seq == -1 and want ~= 'open' then
  return {-3, 0, ''}
end
if seq ~= tonumber(ARGV[1]) or head ~= ARGV[2] then
  local n = tonumber(ARGV[7])
  if seq == tonumber(ARGV[1]) + n and head == ARGV[6 + 3 * n] then
    -- the same events as this append's, at its place: this append sent before,
    -- or another writer's that wrote the very same bodies (two deliveries of one
    -- step in one worker, in one millisecond): that one holds the lease it took
    if ARGV[3] ~= '' and ARGV[4] ~= 'release' then
      local holder = redis.call('GET', KEYS[3])
      if holder and holder ~= ARGV[3] then return {-1, 0, holder} end
    end
    -- the head is this very append, sent again (its reply lost, or too few
    -- replicas confirmed it): rewrite the meta's seq with the value it has, or
    -- should have, so that this call replicates. A server that moves a
    -- connection's WAIT offset only on writes would otherwise let a WAIT after it
    -- on an older connection pass without covering the first send's write.
    redis.call('HSET', KEYS[2], 'seq', seq)
  end
  return {0, seq, head}
end
local token, mode = ARGV[3], ARGV[4]
if token ~= '' then
  local holder = redis.call('GET', KEYS[3])
  if mode == 'acquire' then
    if holder and holder ~= token then return {-1, 0, holder} end
  elseif holder ~= token then
    return {-1, 0, holder or ''}
  end
end
if phase == nil then
  phase = seq == -1 and 'forward' or (redis.call('HGET', KEYS[2], 'phase') or 'forward')
end
if want ~= 'open' and (phase == 'closed' or (want ~= '' and phase ~= want)) then
  return {-2, 0, phase}
end
local n = tonumber(ARGV[7])
local m = 8 + 3 * n
local k = tonumber(ARGV[m])
local first_side = m + 1 + 2 * k
local q = first_side
for _ = 1, tonumber(ARGV[q]) do  -- guards first: nothing is written if one fails
  local op, key, argc = ARGV[q + 1], KEYS[tonumber(ARGV[q + 2])], tonumber(ARGV[q + 3])
  if op == 'absent' and redis.call('EXISTS', key) == 1 then
    return {-4, 0, key}
  end
  q = q + 3 + argc
end
for i = 0, n - 1 do
  local a = 8 + 3 * i
  seq = seq + 1
  if ARGV[a + 2] ~= '' then phase = ARGV[a + 2] end
  redis.call('XADD', KEYS[1], '0-' .. (seq + 1), 'b', ARGV[a], 'h', ARGV[a + 1], 'p', phase)
end
if k > 0 then
  redis.call('HSET', KEYS[2], 'seq', seq, unpack(ARGV, m + 1, m + 2 * k))
end
q = first_side
local pushed = 0
for _ = 1, tonumber(ARGV[q]) do
  local op, key, argc = ARGV[q + 1], KEYS[tonumber(ARGV[q + 2])], tonumber(ARGV[q + 3])
  if op == 'zadd' then
    local score, flags = tonumber(ARGV[q + 5]), ARGV[q + 6]
    if string.find(flags, 'r', 1, true) then
      local t = redis.call('TIME')
      score = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + score
    end
    score = string.format('%.0f', score)
    if string.find(flags, 'n', 1, true) then
      redis.call('ZADD', key, 'NX', score, ARGV[q + 4])
    else
      redis.call('ZADD', key, score, ARGV[q + 4])
    end
  elseif op == 'zrem' then
    redis.call('ZREM', key, ARGV[q + 4])
  elseif op == 'sadd' then
    redis.call('SADD', key, ARGV[q + 4])
  elseif op == 'srem' then
    redis.call('SREM', key, ARGV[q + 4])
  elseif op == 'rpush' then
    pushed = redis.call('RPUSH', key, ARGV[q + 4])
  elseif op == 'hset' then
    redis.call('HSET', key, unpack(ARGV, q + 4, q + 3 + argc))
  elseif op == 'set' then
    redis.call('SET', key, ARGV[q + 4])
  elseif op == 'pexpire' then
    redis.call('PEXPIRE', key, ARGV[q + 4])
  elseif op == 'trim' then
    redis.call('LTRIM', key, n, -1)
  end
  q = q + 3 + argc
end
if token ~= '' then
  if mode == 'acquire' then
    redis.call('SET', KEYS[3], token, 'PX', ARGV[5])
  elseif mode == 'release' then
    redis.call('PEXPIRE', KEYS[3], 0)  -- expire now: workers need no DEL
  end
end
return {1, seq, '', pushed}
