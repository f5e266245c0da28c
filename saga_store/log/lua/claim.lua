-- CLAIM: take an idempotency key for one call, or report who has it; or settle
-- a claim that never became a step.
--
-- KEYS[1] the key's dedupe record, ss:idem:{<key>} (hash)
-- ARGV[1] digest of the call's tool and arguments
-- ARGV[2] saga id        ARGV[3] step        ARGV[4] retention in seconds
-- ARGV[5] mode: ''          claim for (ARGV[2], ARGV[3])
--               'takeover'  move a pending claim held by (ARGV[6], ARGV[7]) to
--                           (ARGV[2], ARGV[3]): the caller found in that saga's
--                           log that the claim never became a step and never can
--               'release'   forget a pending claim held by (ARGV[2], ARGV[3]):
--                           its call failed before its intent was logged
-- returns {'new'}                                   claimed for this call
--         {'conflict'}                              the key came with other arguments
--         {'exists', saga, step, state, result}     held by that call (also: the
--                                                   takeover or release found the
--                                                   claim moved on, so did nothing)
--         {'released'}                              forgotten
local cur = redis.call('HMGET', KEYS[1], 'args', 'saga', 'step', 'state', 'result')
local mode = ARGV[5] or ''
if not cur[1] then
  if mode == 'release' then return {'released'} end
  redis.call('HSET', KEYS[1], 'args', ARGV[1], 'saga', ARGV[2], 'step', ARGV[3],
             'state', 'pending')
  redis.call('EXPIRE', KEYS[1], ARGV[4])
  return {'new'}
end
if cur[1] ~= ARGV[1] then return {'conflict'} end
if cur[4] == 'pending' then
  if mode == 'takeover' and cur[2] == ARGV[6] and cur[3] == ARGV[7] then
    redis.call('HSET', KEYS[1], 'saga', ARGV[2], 'step', ARGV[3])
    redis.call('EXPIRE', KEYS[1], ARGV[4])
    return {'new'}
  end
  if mode == 'release' and cur[2] == ARGV[2] and cur[3] == ARGV[3] then
    redis.call('PEXPIRE', KEYS[1], 0)  -- expire now: no DEL right needed
    return {'released'}
  end
end
return {'exists', cur[2], cur[3], cur[4], cur[5] or ''}
