-- RELEASE_LEASE: expire a lease now if the token still holds it (compare-and-expire;
-- PEXPIRE 0 rather than DEL, so ACL users need no DEL).
--
-- KEYS[1] the lease key        ARGV[1] the holder's token
-- returns 1 if released, 0 if another token (or nobody) held it
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], 0)
end
return 0
