"""The Lua scripts of :class:`~ampmeter.ledgers.RedisLedger`: one per operation, each atomic.

KEYS (same order in every script): 1 spent (hash), 2 reserved (hash), 3 holds (hash: id ->
JSON array ``[key, amount, ...]`` with amounts as the client's exact decimal strings), 4 leases
(sorted set: id by expiry), 5 committed and 6 released (sorted sets: settled ids by time),
7 window (string whose expiry is the scope's TTL). ARGV 1 is the TTL in ms ("" = none), ARGV 2
how many seconds settled ids are kept. Time comes from the server (TIME), never the client.
"""

from __future__ import annotations

__all__ = ["COMMIT", "RELEASE", "RESERVE"]

_PRELUDE = """
if redis.replicate_commands then pcall(redis.replicate_commands) end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local window_ms = nil

local function open_window()
  if ARGV[1] == '' then return end
  local ms = redis.call('PTTL', KEYS[7])
  if ms == -2 then
    -- a new window: whatever is left of the previous one is gone
    for i = 1, 6 do redis.call('DEL', KEYS[i]) end
    ms = tonumber(ARGV[1])
    redis.call('SET', KEYS[7], '1', 'PX', ms)
  elseif ms == -1 then
    ms = tonumber(ARGV[1])
    redis.call('PEXPIRE', KEYS[7], ms)
  end
  window_ms = ms
end

local function close_window()
  if window_ms == nil then return end
  for i = 1, 6 do redis.call('PEXPIRE', KEYS[i], window_ms) end
end

local function drop(id)
  local held = redis.call('HGET', KEYS[3], id)
  if not held then return end
  local flat = cjson.decode(held)
  for i = 1, #flat, 2 do
    redis.call('HINCRBYFLOAT', KEYS[2], flat[i], '-' .. flat[i + 1])
  end
  redis.call('HDEL', KEYS[3], id)
  redis.call('ZREM', KEYS[4], id)
  if redis.call('HLEN', KEYS[3]) == 0 then
    -- no reservation left: back to exact zero instead of float residue
    redis.call('DEL', KEYS[2])
  end
end

local function reap()
  local expired = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now, 'LIMIT', 0, 512)
  for _, id in ipairs(expired) do
    drop(id)
    redis.call('ZREM', KEYS[4], id)
  end
  local horizon = now - tonumber(ARGV[2])
  redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', horizon)
  redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', horizon)
end

open_window()
reap()
"""

# ARGV 3 id, 4 lease seconds ("" = none), 5 n, then n (key, amount) pairs, then m, then m
# (key, ceiling) pairs. Returns {1 | 0, seconds, microseconds} of the server clock.
RESERVE = (
    _PRELUDE
    + """
local id = ARGV[3]
local wanted = {}
local flat = {}
local i = 6
for _ = 1, tonumber(ARGV[5]) do
  local key, amount = ARGV[i], ARGV[i + 1]
  local value = tonumber(amount)
  wanted[key] = (wanted[key] or 0) + value
  if value ~= 0 then
    flat[#flat + 1] = key
    flat[#flat + 1] = amount
  end
  i = i + 2
end
local m = tonumber(ARGV[i])
i = i + 1
for _ = 1, m do
  local key, ceiling = ARGV[i], tonumber(ARGV[i + 1])
  local spent = tonumber(redis.call('HGET', KEYS[1], key) or '0')
  local held = tonumber(redis.call('HGET', KEYS[2], key) or '0')
  if spent + held + (wanted[key] or 0) > ceiling then
    close_window()
    return {0, t[1], t[2]}
  end
  i = i + 2
end
for j = 1, #flat, 2 do
  redis.call('HINCRBYFLOAT', KEYS[2], flat[j], flat[j + 1])
end
redis.call('HSET', KEYS[3], id, cjson.encode(flat))
local expiry = '+inf'
if ARGV[4] ~= '' then expiry = now + tonumber(ARGV[4]) end
redis.call('ZADD', KEYS[4], expiry, id)
close_window()
return {1, t[1], t[2]}
"""
)

# ARGV 3 id, 4 n, then n (key, amount) pairs. Returns 1 if applied, 0 if already committed.
COMMIT = (
    _PRELUDE
    + """
local id = ARGV[3]
if redis.call('ZSCORE', KEYS[5], id) then
  close_window()
  return 0
end
drop(id)
local i = 5
for _ = 1, tonumber(ARGV[4]) do
  if tonumber(ARGV[i + 1]) ~= 0 then
    redis.call('HINCRBYFLOAT', KEYS[1], ARGV[i], ARGV[i + 1])
  end
  i = i + 2
end
redis.call('ZREM', KEYS[6], id)
redis.call('ZADD', KEYS[5], now, id)
close_window()
return 1
"""
)

# ARGV 3 id. Returns 1 if applied, 0 if the id was already settled.
RELEASE = (
    _PRELUDE
    + """
local id = ARGV[3]
if redis.call('ZSCORE', KEYS[5], id) or redis.call('ZSCORE', KEYS[6], id) then
  close_window()
  return 0
end
drop(id)
redis.call('ZADD', KEYS[6], now, id)
close_window()
return 1
"""
)
