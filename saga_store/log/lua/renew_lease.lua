-- RENEW_LEASE: extend a lease the token holds, or take it back if it lapsed.
--
-- KEYS[1] the lease key        ARGV[1] the holder's token      ARGV[2] ttl in ms
-- returns 1 if the token holds the lease now, 0 if another holder has it
local h = redis.call('GET', KEYS[1])
if h == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
elseif not h then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
