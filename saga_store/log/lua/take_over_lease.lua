-- TAKE_OVER_LEASE: take a lease from a holder known to be gone, if it still holds it.
--
-- KEYS[1] the lease key   ARGV[1] the gone holder's token   ARGV[2] the new token
-- ARGV[3] ttl in ms
-- returns 1 if taken over, 0 if the lease changed hands meanwhile
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
