-- HEARTBEAT: note on a worker's RQ registration when it last beat, by Redis's
-- clock. RQ's own last_heartbeat is the worker host's time, which a reader on
-- another host cannot compare with its own clock.
--
-- KEYS[1] the worker's registration (rq:worker:<name>)
-- ARGV[1] the field to write
-- returns 1, or 0 if the registration is gone (it is not written anew: it would
-- never expire)
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
local t = redis.call('TIME')
redis.call('HSET', KEYS[1], ARGV[1],
           string.format('%.0f', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)))
return 1
