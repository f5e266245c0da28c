-- SCHEDULE: put a saga in an index of sagas in flight, due some time from now by
-- Redis's clock: the hosts that schedule and the sweepers that look need not
-- agree on the time.
--
-- KEYS[1] the index (a sorted set: saga id -> when to look, ms since the epoch)
-- ARGV[1] the saga id      ARGV[2] ms from now      ARGV[3] 'nx': keep a time already set
-- returns what ZADD returns: 1 if the saga was added, else 0
local t = redis.call('TIME')
local at = string.format('%.0f', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
                                 + tonumber(ARGV[2]))
if ARGV[3] == 'nx' then
  return redis.call('ZADD', KEYS[1], 'NX', at, ARGV[1])
end
return redis.call('ZADD', KEYS[1], at, ARGV[1])
