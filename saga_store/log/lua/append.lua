-- APPEND: compare-and-set a chain's head, check lease and phase, add events.
--
-- Redis Lua has no SHA-256, so hashes come from the client; this script only
-- compares and sets. It touches the keys of one chain, all under one hash tag
-- (one Cluster slot).
--
-- KEYS[1] chain log stream      KEYS[2] chain meta hash      KEYS[3] lease key
-- KEYS[4] (optional) a list whose first n items the events came from: trimmed
--         off in the same step (the ledger's pending entries)
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
-- ARGV[7] n, the number of events
-- ARGV[8 .. 7+2n] body and hash of each event, in order
-- ARGV[8+2n ..] field/value pairs written to meta after the append
-- returns {1, new head seq, ''}            appended
--         {0, head seq, head hash}         head moved: re-read, decide again
--         {-1, 0, holder}                  lease held by another token (fenced off)
--         {-2, 0, phase}                   saga is in another phase
--         {-3, 0, ''}                      no such chain, and this is no opening
local unpack = unpack or table.unpack
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
local seq, head = -1, ''
if last[1] then
  seq = tonumber(string.match(last[1][1], '^0%-(%d+)$') or '0') - 1
  local f = last[1][2]
  for i = 1, #f, 2 do
    if f[i] == 'h' then head = f[i + 1] end
  end
end
local want = ARGV[6]
if seq == -1 and want ~= 'open' then
  return {-3, 0, ''}
end
if seq ~= tonumber(ARGV[1]) or head ~= ARGV[2] then
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
if want ~= 'open' then
  local phase = redis.call('HGET', KEYS[2], 'phase') or 'forward'
  if phase == 'closed' or (want ~= '' and phase ~= want) then
    return {-2, 0, phase}
  end
end
local n = tonumber(ARGV[7])
for i = 0, n - 1 do
  local a = 8 + 2 * i
  seq = seq + 1
  redis.call('XADD', KEYS[1], '0-' .. (seq + 1), 'b', ARGV[a], 'h', ARGV[a + 1])
end
if KEYS[4] then
  redis.call('LTRIM', KEYS[4], n, -1)
end
local m = 8 + 2 * n
if #ARGV >= m then
  redis.call('HSET', KEYS[2], 'seq', seq, unpack(ARGV, m))
end
if token ~= '' then
  if mode == 'acquire' then
    redis.call('SET', KEYS[3], token, 'PX', ARGV[5])
  elseif mode == 'release' then
    redis.call('PEXPIRE', KEYS[3], 0)  -- expire now: workers need no DEL
  end
end
return {1, seq, ''}
