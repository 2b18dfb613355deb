"""The Lua scripts of :class:`~ampmeter.ledgers.RedisLedger`: one per operation, each atomic.

A scope tree (every scope under one root) lives in seven keys that share one hash tag, so a
script touches only declared keys of one Redis Cluster slot. KEYS (same order in every
script): 1 spent and 2 reserved (hashes: field ``<path below the root>\\x1f<key>``, or just
``<key>`` for the root itself), 3 holds (hash: id -> JSON ``{"s": scopes, "p": field prefixes,
"a": [key, amount, ...]}`` with amounts as the client's exact decimal strings), 4 leases (sorted
set: id by expiry), 5 committed and 6 released (sorted sets: settled ids by time), 7 window
(string whose expiry is the tree's TTL). ARGV 1 is the TTL in ms ("" = none), ARGV 2 how many
seconds settled ids are kept. Time comes from the server (TIME), never the client.
"""

from __future__ import annotations

__all__ = ["COMMIT", "RELEASE", "RENEW", "RESERVE"]

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

local function settled(id)
  return redis.call('ZSCORE', KEYS[5], id) or redis.call('ZSCORE', KEYS[6], id)
end

local function drop(id)
  local held = redis.call('HGET', KEYS[3], id)
  if not held then return end
  local hold = cjson.decode(held)
  local prefixes, flat = hold.p, hold.a
  if prefixes == nil then prefixes, flat = {''}, hold end  -- a hold of a flat-scope version
  redis.call('HDEL', KEYS[3], id)
  redis.call('ZREM', KEYS[4], id)
  if redis.call('HLEN', KEYS[3]) == 0 then
    -- no reservation left: back to exact zero instead of float residue
    redis.call('DEL', KEYS[2])
    return
  end
  for _, prefix in ipairs(prefixes) do
    for i = 1, #flat, 2 do
      if tonumber(flat[i + 1]) ~= 0 then
        local field = prefix .. flat[i]
        local left = redis.call('HINCRBYFLOAT', KEYS[2], field, '-' .. flat[i + 1])
        if tonumber(left) == 0 then redis.call('HDEL', KEYS[2], field) end
      end
    end
  end
end

local function reap()
  local expired = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now)
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

# ARGV 3 id, 4 lease seconds ("" = none), 5 the hold's JSON, 6 how many scopes, then per scope
# its field prefix, m, and m (key, ceiling) pairs. Returns {status, seconds, microseconds of
# the server clock, hold JSON, expiry}: status 1 taken, 0 refused (a settled id), 2 already
# held under this id (then the JSON and expiry are the existing hold's), 3 refused by a
# ceiling: then the fourth item is the JSON [scope number, key, spent, reserved] (the hash
# values as stored) of the ceiling that refused - one broken by what is spent alone, at any
# scope, before one broken only by reservations in flight.
RESERVE = (
    _PRELUDE
    + """
local id = ARGV[3]
if settled(id) then
  close_window()
  return {0, t[1], t[2], '', ''}
end
local existing = redis.call('HGET', KEYS[3], id)
if existing then
  close_window()
  return {2, t[1], t[2], existing, redis.call('ZSCORE', KEYS[4], id) or ''}
end
local hold = cjson.decode(ARGV[5])
local flat = hold.a
local wanted = {}
for j = 1, #flat, 2 do
  wanted[flat[j]] = (wanted[flat[j]] or 0) + tonumber(flat[j + 1])
end
local i = 7
local busy = nil
for n = 1, tonumber(ARGV[6]) do
  local prefix, m = ARGV[i], tonumber(ARGV[i + 1])
  i = i + 2
  for _ = 1, m do
    local key, ceiling = ARGV[i], tonumber(ARGV[i + 1])
    local spent = redis.call('HGET', KEYS[1], prefix .. key) or '0'
    local held = redis.call('HGET', KEYS[2], prefix .. key) or '0'
    local amount = wanted[key] or 0
    if tonumber(spent) + tonumber(held) + amount > ceiling then
      local found = cjson.encode({n, key, spent, held})
      if tonumber(spent) + amount > ceiling then
        close_window()
        return {3, t[1], t[2], found, ''}
      end
      busy = busy or found
    end
    i = i + 2
  end
end
if busy then
  close_window()
  return {3, t[1], t[2], busy, ''}
end
for _, prefix in ipairs(hold.p) do
  for j = 1, #flat, 2 do
    if tonumber(flat[j + 1]) ~= 0 then
      redis.call('HINCRBYFLOAT', KEYS[2], prefix .. flat[j], flat[j + 1])
    end
  end
end
redis.call('HSET', KEYS[3], id, ARGV[5])
local expiry = '+inf'
if ARGV[4] ~= '' then expiry = now + tonumber(ARGV[4]) end
redis.call('ZADD', KEYS[4], expiry, id)
close_window()
return {1, t[1], t[2], '', ''}
"""
)

# ARGV 3 id, 4 how many field prefixes, the prefixes, then n and n (key, amount) pairs.
# Returns 1 if applied, 0 if already committed.
COMMIT = (
    _PRELUDE
    + """
local id = ARGV[3]
if redis.call('ZSCORE', KEYS[5], id) then
  close_window()
  return 0
end
drop(id)
local count = tonumber(ARGV[4])
local i = 5 + count
local n = tonumber(ARGV[i])
for p = 5, 4 + count do
  local j = i + 1
  for _ = 1, n do
    if tonumber(ARGV[j + 1]) ~= 0 then
      redis.call('HINCRBYFLOAT', KEYS[1], ARGV[p] .. ARGV[j], ARGV[j + 1])
    end
    j = j + 2
  end
end
redis.call('ZREM', KEYS[6], id)
redis.call('ZADD', KEYS[5], now, id)
close_window()
return 1
"""
)

# ARGV 3 id. Returns 1 if applied (a tombstone for an id never reserved), 0 if already settled.
RELEASE = (
    _PRELUDE
    + """
local id = ARGV[3]
if settled(id) then
  close_window()
  return 0
end
drop(id)
redis.call('ZADD', KEYS[6], now, id)
close_window()
return 1
"""
)

# ARGV 3 lease seconds ("" = none), 4... ids. Returns the ids that were live (and are renewed).
RENEW = (
    _PRELUDE
    + """
local live = {}
for i = 4, #ARGV do
  local id = ARGV[i]
  if redis.call('HEXISTS', KEYS[3], id) == 1 then
    if ARGV[3] ~= '' then redis.call('ZADD', KEYS[4], 'XX', now + tonumber(ARGV[3]), id) end
    live[#live + 1] = id
  end
end
close_window()
return live
"""
)
