-- ARCHIVE: remove a closed saga from Redis and push its tombstone onto its
-- bucket's ledger pending list, in one step: no saga is ever gone without the
-- ledger entry that says where it went, and no tombstone names a saga still here.
-- Of layout 3 every key below carries the bucket's hash tag (one Cluster slot).
-- It is run by an operator's admin user: the worker and agent ACL users may not
-- UNLINK, and the script checks that before it writes anything (a script is not
-- rolled back when a command in it is refused).
--
-- KEYS[1] the saga's log stream     KEYS[2] its bucket's ledger pending list
-- KEYS[3] the needs-attention set   KEYS[4] the approvals index
-- KEYS[5], KEYS[6] the indexes of sagas in flight it may be in
-- KEYS[7 ..] the saga's other keys (meta, lease, driver, secrets, blobs)
-- ARGV[1] the entry id of the close it is archived at ('0-<seq+1>')
-- ARGV[2] that entry's hash (32 raw bytes)
-- ARGV[3] the tombstone (a pending ledger entry, JSON)
-- ARGV[4] the saga id
-- ARGV[5 ..] members of the approvals index that may be the saga's ('<saga>:<step>')
-- returns {1, pending length} removed; {0, 'gone'} its log no longer exists;
--         {-1, why} refused: its head moved, or this user may not remove it
for _, cmd in ipairs({'UNLINK', 'RPUSH', 'SREM', 'ZREM'}) do
  if not redis.acl_check_cmd(cmd, KEYS[1]) or not redis.acl_check_cmd(cmd, KEYS[2]) then
    return {-1, 'noperm ' .. cmd}
  end
end
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
if #last == 0 then
  return {0, 'gone'}
end
if last[1][1] ~= ARGV[1] then
  return {-1, 'moved: its last entry is ' .. last[1][1] .. ', not ' .. ARGV[1]}
end
local fields, h = last[1][2], nil
for i = 1, #fields - 1, 2 do
  if fields[i] == 'h' then h = fields[i + 1] end
end
if h ~= ARGV[2] then
  return {-1, 'rewritten: its last entry is not the one archived'}
end
local n = redis.call('RPUSH', KEYS[2], ARGV[3])
redis.call('UNLINK', KEYS[1], unpack(KEYS, 7))
redis.call('SREM', KEYS[3], ARGV[4])
redis.call('ZREM', KEYS[5], ARGV[4])
redis.call('ZREM', KEYS[6], ARGV[4])
for i = 5, #ARGV do
  redis.call('ZREM', KEYS[4], ARGV[i])
end
return {1, n}
