"""Lua scripts. Redis Lua has no SHA-256, so hashes come from the client and
the script only compares and sets. Each script touches the keys of one chain,
all under one hash tag (one Cluster slot).

APPEND
    KEYS[1] chain log stream     KEYS[2] chain meta hash    KEYS[3] lease key
    ARGV[1] expected head seq (-1 for an empty chain)
    ARGV[2] expected head hash (32 raw bytes; empty for an empty chain)
    ARGV[3] lease token that must hold KEYS[3] ('' = no check)
    ARGV[4] phase the meta must be in ('' = no check; missing phase = forward)
    ARGV[5] n, the number of events
    ARGV[6 .. 5+2n] body and hash of each event, in order
    ARGV[6+2n ..] field/value pairs written to meta after the append
    returns {1, new head seq, ''}            appended
            {0, head seq, head hash}         head moved: re-read, decide again
            {-1, 0, ''}                      lease not held (fenced off)
            {-2, 0, phase}                   saga is in another phase
"""

from __future__ import annotations

from typing import Any

APPEND = """
local unpack = unpack or table.unpack
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
local seq, head = -1, ''
if last[1] then
  seq = tonumber(string.match(last[1][1], '^0%-(%d+)$') or '0') - 1
  local f = last[1][2]
  for i = 1, #f, 2 do
    if f[i] == 'h' then head = f[i + 1] end
  end
end
if seq ~= tonumber(ARGV[1]) or head ~= ARGV[2] then
  return {0, seq, head}
end
if ARGV[3] ~= '' and redis.call('GET', KEYS[3]) ~= ARGV[3] then
  return {-1, 0, ''}
end
if ARGV[4] ~= '' then
  local phase = redis.call('HGET', KEYS[2], 'phase') or 'forward'
  if phase ~= ARGV[4] then return {-2, 0, phase} end
end
local n = tonumber(ARGV[5])
for i = 0, n - 1 do
  local a = 6 + 2 * i
  seq = seq + 1
  redis.call('XADD', KEYS[1], '0-' .. (seq + 1), 'b', ARGV[a], 'h', ARGV[a + 1])
end
local m = 6 + 2 * n
if #ARGV >= m then
  redis.call('HSET', KEYS[2], 'seq', seq, unpack(ARGV, m))
end
return {1, seq, ''}
"""


class Scripts:
    """Registers each script once per client; calls go by SHA (EVALSHA)."""

    def __init__(self, redis: Any) -> None:
        self.append = redis.register_script(APPEND)
