-- LEDGER_CUT: drop the archived prefix of a ledger chain, seqs 0 .. k, and record
-- where the chain now starts, its base (seq k and its hash), in one step: a
-- chain is never shorter in Redis without the base that proves what it starts
-- from. Run after the archive's signed manifest lists the prefix (see
-- saga_store/log/ledger_cut.py); running it again for the same cut changes
-- nothing. Of every key below the hash tag is the chain's (one Cluster slot).
-- It checks, before it writes anything, that this user may trim the chain (the
-- worker and agent ACL users may not, on purpose).
--
-- KEYS[1] the ledger chain's stream    KEYS[2] its base (string "<seq> <hash hex>")
-- ARGV[1] k, the seq of the last entry to drop (the new base)
-- ARGV[2] that entry's hash (32 raw bytes)
-- ARGV[3] the same hash, as hex
-- returns {1, 'cut'}      cut now
--         {1, 'done'}     the base is k already (an earlier run cut it)
--         {-1, why}       refused: the entry at k is not the one archived (or gone),
--                         the chain would be left empty, the base is past k, or
--                         this user may not trim
for _, cmd in ipairs({'XTRIM', 'SET'}) do
  if not redis.acl_check_cmd(cmd, KEYS[1]) or not redis.acl_check_cmd(cmd, KEYS[2]) then
    return {-1, 'noperm ' .. cmd}
  end
end
local k = tonumber(ARGV[1])
local base = redis.call('GET', KEYS[2])
if base then
  local at = tonumber(string.match(base, '^(%d+) '))
  if at == k and string.sub(base, #base - 63) == ARGV[3] then
    return {1, 'done'}
  end
  if at == k then
    return {-1, 'the chain\'s base at seq ' .. k .. ' has another hash: ' .. base}
  end
  if at > k then
    return {-1, 'the chain starts after seq ' .. k .. ' already (its base is ' .. base .. ')'}
  end
end
local eid = '0-' .. (k + 1)
local row = redis.call('XRANGE', KEYS[1], eid, eid)
if #row == 0 then
  return {-1, 'the chain holds no entry at seq ' .. k}
end
local h = nil
local fields = row[1][2]
for i = 1, #fields - 1, 2 do
  if fields[i] == 'h' then h = fields[i + 1] end
end
if h ~= ARGV[2] then
  return {-1, 'the entry at seq ' .. k .. ' is not the one archived (another hash)'}
end
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
if last[1][1] == eid then
  return {-1, 'seq ' .. k .. ' is the chain\'s last entry: a chain is never left empty'}
end
redis.call('SET', KEYS[2], k .. ' ' .. ARGV[3])
redis.call('XTRIM', KEYS[1], 'MINID', '0-' .. (k + 2))
return {1, 'cut'}
