-- FENCE_LEASE: whether the holder of a saga's lease may go on with the work it
-- holds the lease for (a step's next try, a renewal while a call or a back-off
-- runs); if so the lease is set to ARGV[2] ms from now.
--
-- A lease that lapsed (an outage, a stall longer than the lease) is taken back
-- only when nobody acted on the saga meanwhile: every entry appended after the
-- last one the holder knows must be a note (a duplicate delivery suppressed).
-- Whoever else runs the step or unwinds the saga appends first (its own
-- step_started, saga_failed, a compensation's intent), so a holder never runs a
-- try after another worker started one.
--
-- KEYS[1] the lease key        KEYS[2] the saga's log stream (same hash tag)
-- ARGV[1] the holder's token   ARGV[2] ttl in ms (Redis's clock, relative)
-- ARGV[3] the entry id of the last entry the holder knows ('0-<seq+1>')
-- ARGV[4] 'gt': a held lease only ever grows (the event loop's renewals of an
--         async call: a loop that stalls under load never shortens the lease its
--         try took); '' sets it to ARGV[2] (a thread's renewals, the check before
--         a try: a worker cut off loses the step one lease after its last renewal)
-- returns 1 if the token holds the lease now, 0 if not (another holder has it,
-- or the saga moved on while it was free)
local h = redis.call('GET', KEYS[1])
if h == ARGV[1] then
  if ARGV[4] == 'gt' then
    -- never cut short a longer lease (the one a try took for its tool's timeout)
    redis.call('PEXPIRE', KEYS[1], ARGV[2], 'GT')
    return 1
  end
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
elseif h then
  return 0
end
local later = redis.call('XRANGE', KEYS[2], '(' .. ARGV[3], '+', 'COUNT', 64)
if #later >= 64 then
  return 0
end
for _, entry in ipairs(later) do
  local f, body = entry[2], nil
  for i = 1, #f, 2 do
    if f[i] == 'b' then body = f[i + 1] end
  end
  local ok, ev = pcall(cjson.decode, body or '')
  if not ok or type(ev) ~= 'table' or ev.kind ~= 'step_duplicate_suppressed' then
    return 0
  end
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
