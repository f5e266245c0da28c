-- CLAIM: take an idempotency key for one call, or report who has it.
--
-- KEYS[1] the key's dedupe record, ss:idem:{<key>} (hash)
-- ARGV[1] digest of the call's tool and arguments
-- ARGV[2] saga id        ARGV[3] step        ARGV[4] retention in seconds
-- returns {'new'}                                   claimed for this call
--         {'conflict'}                              the key came with other arguments
--         {'exists', saga, step, state, result}     already claimed by that call
local cur = redis.call('HMGET', KEYS[1], 'args', 'saga', 'step', 'state', 'result')
if not cur[1] then
  redis.call('HSET', KEYS[1], 'args', ARGV[1], 'saga', ARGV[2], 'step', ARGV[3],
             'state', 'pending')
  redis.call('EXPIRE', KEYS[1], ARGV[4])
  return {'new'}
end
if cur[1] ~= ARGV[1] then return {'conflict'} end
return {'exists', cur[2], cur[3], cur[4], cur[5] or ''}
