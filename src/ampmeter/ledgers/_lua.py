"""The Lua scripts of :class:`~ampmeter.ledgers.RedisLedger`: one per operation, each atomic.

A scope tree (every scope under one root) lives in keys that share one hash tag, so a script
touches only declared keys of one Redis Cluster slot. Every amount is an integer (nano-dollars
for money keys), stored as Redis integers and changed with ``HINCRBY``; Lua compares them as
doubles, exact up to 2^53 (over nine million dollars). Amounts travel as decimal strings and
are never formatted by Lua, so no digit is lost.

KEYS (same order in every script): 1 spent, 2 reserved and 10 unsettled (hashes: field
``<path below the root>\\x1f<key>``, or just ``<key>`` for the root itself); 3 holds (hash: id ->
JSON ``{"s": scopes, "p": field prefixes, "a": [key, amount, ...], "x": 1 if its expiry charges
it}``); 4 leases (sorted set: id by expiry); 5 committed and 6 released (sorted sets: settled
ids by time); 7 window (string whose expiry is the tree's TTL); 8 windowed (hash: field -> the
longest sliding window asked for on it, in seconds); 9 window events (sorted set:
``<field>\\x1f<id>\\x1f<amount>`` by the time its commit was applied); 11 expired (hash: id ->
the hold charged when its lease ended) and 12 its times (sorted set); 13 ceilings (hash: field
prefix -> JSON ``{key: "max"}``); 14 idempotency keys (hash: ``<prefix><key>`` -> the JSON
amounts of their first settlement) and 15 their times (sorted set); 16 notes (hash:
``<prefix><name>`` -> text: an operator's pause or raise, a call paused at its cap, a claim; see
:mod:`ampmeter.ledgers._notes`). ARGV 1 is the TTL in ms ("" = none), ARGV 2 how many seconds
settled ids, expired holds and idempotency keys are kept. Time comes from the server (TIME),
never the client.
"""

from __future__ import annotations

__all__ = [
    "CEILINGS",
    "NOTE",
    "READ",
    "RECENT",
    "RENEW",
    "RESERVE",
    "SETTLE",
]

_PRELUDE = """
if redis.replicate_commands then pcall(redis.replicate_commands) end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local window_ms = nil
local tree = {1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 12, 13, 14, 15, 16}  -- all but the marker

local function open_window()
  local ms = redis.call('PTTL', KEYS[7])
  if ARGV[1] == '' then
    -- a ledger without a TTL on a window's tree: what it writes ends with the window too
    if ms > 0 then window_ms = ms end
    return
  end
  if ms == -2 then
    -- a new window: whatever is left of the previous one is gone (its keys expired with it);
    -- a key that never expires was written to a tree kept for good, never wiped here
    for _, i in ipairs(tree) do
      if redis.call('PTTL', KEYS[i]) == -1 then
        -- (a string: Redis 6 cannot report an error raised as a table from a function)
        error('the scope tree is kept without a ttl_s: a ledger with ttl_s would '
          .. 'wipe its spend (open every ledger of one tree with one ttl_s)')
      end
    end
    for _, i in ipairs(tree) do redis.call('DEL', KEYS[i]) end
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
  for _, i in ipairs(tree) do redis.call('PEXPIRE', KEYS[i], window_ms) end
end

-- Add (sign 1) or subtract (-1) an amount (a decimal string) to a field of hash KEYS[k].
local function add(k, field, amount, sign)
  if amount == '0' then return end
  if sign < 0 then amount = '-' .. amount end
  if redis.call('HINCRBY', KEYS[k], field, amount) == 0 then redis.call('HDEL', KEYS[k], field) end
end

-- Add a hold's amounts at each of its scopes to hash KEYS[k].
local function add_hold(k, hold, sign)
  for _, prefix in ipairs(hold.p) do
    for i = 1, #hold.a, 2 do add(k, prefix .. hold.a[i], hold.a[i + 1], sign) end
  end
end

-- Count a hold charged as unsettled in the sliding windows of its fields (sign 1), or take
-- it out of them (-1).
local function window_hold(id, hold, sign)
  for _, prefix in ipairs(hold.p) do
    for i = 1, #hold.a, 2 do
      local field = prefix .. hold.a[i]
      local member = field .. '\\31' .. id .. '\\31' .. hold.a[i + 1]
      if sign < 0 then
        redis.call('ZREM', KEYS[9], member)
      elseif hold.a[i + 1] ~= '0' and redis.call('HEXISTS', KEYS[8], field) == 1 then
        redis.call('ZADD', KEYS[9], now, member)
      end
    end
  end
end

-- End a hold (its reserved amounts return); its JSON, or nil if there was none.
local function drop(id)
  local raw = redis.call('HGET', KEYS[3], id)
  if not raw then return nil end
  redis.call('HDEL', KEYS[3], id)
  redis.call('ZREM', KEYS[4], id)
  add_hold(2, cjson.decode(raw), -1)
  return raw
end

-- Take back the unsettled charge of a hold whose lease ended (its settlement came).
local function uncharge(id)
  local raw = redis.call('HGET', KEYS[11], id)
  if not raw then return end
  local hold = cjson.decode(raw)
  add_hold(1, hold, -1)
  add_hold(10, hold, -1)
  window_hold(id, hold, -1)
  redis.call('HDEL', KEYS[11], id)
  redis.call('ZREM', KEYS[12], id)
end

local function forget(zset, hash, horizon)
  for _, member in ipairs(redis.call('ZRANGEBYSCORE', zset, '-inf', horizon)) do
    redis.call('HDEL', hash, member)
  end
  redis.call('ZREMRANGEBYSCORE', zset, '-inf', horizon)
end

local function reap()
  local expired = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now)
  for _, id in ipairs(expired) do
    local raw = drop(id)
    redis.call('ZREM', KEYS[4], id)
    if raw then
      local hold = cjson.decode(raw)
      if hold.x == 1 then
        -- its request may have been billed: charged as unsettled spend until settled
        add_hold(1, hold, 1)
        add_hold(10, hold, 1)
        window_hold(id, hold, 1)
        redis.call('HSET', KEYS[11], id, raw)
        redis.call('ZADD', KEYS[12], now, id)
      end
    end
  end
  local horizon = now - tonumber(ARGV[2])
  redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', horizon)
  redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', horizon)
  forget(KEYS[12], KEYS[11], horizon)
  forget(KEYS[15], KEYS[14], horizon)
end

-- What was committed of a field since `start` (the window events' amounts).
local function recent(field, start)
  local total = 0
  local head = field .. '\\31'
  for _, member in ipairs(redis.call('ZRANGEBYSCORE', KEYS[9], '(' .. start, '+inf')) do
    if string.sub(member, 1, #head) == head then
      total = total + tonumber(string.match(member, '\\31([^\\31]*)$'))
    end
  end
  return total
end

open_window()
reap()
local function main()
"""

# Every script's body ends the function the prelude opens; the epilogue keeps the tree's TTL.
_EPILOGUE = """
end
local result = main()
close_window()
return result
"""

# ARGV 3 id, 4 lease seconds ("" = none), 5 the amounts' JSON [key, amount, ...], 6 "1" if
# the hold's expiry charges it, 7 the JSON of the scopes on the path (the own scope first, then
# each enclosing one), each [name, field prefix, true if the caller named it, [key, ceiling,
# ...]]; 8 the JSON of the sliding windows at the own scope, [[field, window seconds, ceiling],
# ...]. Returns {status, JSON, expiry}: status 1 taken (the new hold and its expiry: the
# server's clock, "inf" without a lease), 0 refused (a settled id), 2 already held under this id
# (the existing hold and its expiry), 3 refused by a ceiling: the JSON [scope number, key, spent,
# reserved, ceiling] of the ceiling that refused - one broken by what is spent alone, at any
# scope, before one broken only by reservations in flight; 4 refused by a window (checked once
# every ceiling fits): [window number, committed in the window, reserved]; 5 refused because
# the scope with that number is paused.
RESERVE = (
    _PRELUDE
    + """
local id = ARGV[3]
local path = {}
for n, step in ipairs(cjson.decode(ARGV[7])) do
  local entry = {name = step[1], prefix = step[2], given = step[3], ceilings = {}, order = {}}
  for j = 1, #step[4], 2 do
    entry.ceilings[step[4][j]] = step[4][j + 1]
    entry.order[#entry.order + 1] = step[4][j]
  end
  path[n] = entry
end
for n, entry in ipairs(path) do
  if redis.call('HEXISTS', KEYS[16], entry.prefix .. 'pause') == 1 then  -- _notes.PAUSE
    return {5, tostring(n), ''}
  end
end
if redis.call('ZSCORE', KEYS[5], id) or redis.call('ZSCORE', KEYS[6], id)
  or redis.call('HEXISTS', KEYS[11], id) == 1 then
  return {0, '', ''}
end
local existing = redis.call('HGET', KEYS[3], id)
if existing then
  return {2, existing, redis.call('ZSCORE', KEYS[4], id) or ''}
end
local flat = cjson.decode(ARGV[5])
local wanted = {}
for j = 1, #flat, 2 do
  wanted[flat[j]] = (wanted[flat[j]] or 0) + tonumber(flat[j + 1])
end
local scopes, prefixes = {}, {}
local busy = nil
for n, entry in ipairs(path) do
  local kept = redis.call('HGET', KEYS[13], entry.prefix)
  local has_kept = false
  if kept then
    for key, ceiling in pairs(cjson.decode(kept)) do
      has_kept = true
      local given = entry.ceilings[key]
      if given == nil then
        entry.order[#entry.order + 1] = key
        entry.ceilings[key] = ceiling
      elseif tonumber(ceiling) < tonumber(given) then
        entry.ceilings[key] = ceiling
      end
    end
  end
  if n == 1 or entry.given or has_kept then
    scopes[#scopes + 1] = entry.name
    prefixes[#prefixes + 1] = entry.prefix
    for _, key in ipairs(entry.order) do
      local ceiling = entry.ceilings[key]
      local spent = redis.call('HGET', KEYS[1], entry.prefix .. key) or '0'
      local held = redis.call('HGET', KEYS[2], entry.prefix .. key) or '0'
      local amount = wanted[key] or 0
      if tonumber(spent) + tonumber(held) + amount > tonumber(ceiling) then
        local found = cjson.encode({n, key, spent, held, ceiling})
        if tonumber(spent) + amount > tonumber(ceiling) then
          return {3, found, ''}
        end
        busy = busy or found
      end
    end
  end
end
if busy then
  return {3, busy, ''}
end
local windows = cjson.decode(ARGV[8])
if #windows > 0 then
  local longest = 0
  for _, window in ipairs(windows) do
    local field, span = window[1], tonumber(window[2])
    local keep = tonumber(redis.call('HGET', KEYS[8], field) or '0')
    if span > keep then redis.call('HSET', KEYS[8], field, window[2]) end
  end
  for _, keep in ipairs(redis.call('HVALS', KEYS[8])) do
    longest = math.max(longest, tonumber(keep))
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[9], '-inf', now - longest)
  local key_of = string.len(path[1].prefix)
  for n, window in ipairs(windows) do
    local field, span, ceiling = window[1], tonumber(window[2]), tonumber(window[3])
    local held = redis.call('HGET', KEYS[2], field) or '0'
    local used = recent(field, now - span)
    if used + tonumber(held) + (wanted[string.sub(field, key_of + 1)] or 0) > ceiling then
      return {4, cjson.encode({n, string.format('%.0f', used), held}), ''}
    end
  end
end
local hold = {s = scopes, p = prefixes, a = flat, x = tonumber(ARGV[6])}
add_hold(2, hold, 1)
local raw = cjson.encode(hold)
redis.call('HSET', KEYS[3], id, raw)
local expiry = '+inf'
if ARGV[4] ~= '' then expiry = now + tonumber(ARGV[4]) end
redis.call('ZADD', KEYS[4], expiry, id)
return {1, raw, redis.call('ZSCORE', KEYS[4], id)}
"""
    + _EPILOGUE
)

# ARGV 3 id, 4 "1" to commit ("0" to release), 5 the idempotency field ("" = none), 6 the
# amounts' JSON [key, amount, ...] (also kept for the idempotency field), 7 the JSON of the field
# prefixes of its scopes. A commit after a release still adds what was spent; anything else
# settles once (a release of an id never reserved leaves a tombstone). Returns {1, ""} if
# applied, {0, ""} if already settled, {2, JSON} if the idempotency field was seen (the JSON of
# its first settlement's amounts; nothing added).
SETTLE = (
    _PRELUDE
    + """
local id, commit = ARGV[3], ARGV[4] == '1'
if redis.call('ZSCORE', KEYS[5], id) or (not commit and redis.call('ZSCORE', KEYS[6], id)) then
  return {0, ''}
end
drop(id)
uncharge(id)
if not commit then
  redis.call('ZADD', KEYS[6], now, id)
  return {1, ''}
end
redis.call('ZREM', KEYS[6], id)
redis.call('ZADD', KEYS[5], now, id)
if ARGV[5] ~= '' then
  local seen = redis.call('HGET', KEYS[14], ARGV[5])
  if seen then
    return {2, seen}
  end
  redis.call('HSET', KEYS[14], ARGV[5], ARGV[6])
  redis.call('ZADD', KEYS[15], now, ARGV[5])
end
local amounts = cjson.decode(ARGV[6])
for _, prefix in ipairs(cjson.decode(ARGV[7])) do
  for j = 1, #amounts, 2 do
    if amounts[j + 1] ~= '0' then
      local field = prefix .. amounts[j]
      add(1, field, amounts[j + 1], 1)
      if redis.call('HEXISTS', KEYS[8], field) == 1 then
        redis.call('ZADD', KEYS[9], now, field .. '\\31' .. id .. '\\31' .. amounts[j + 1])
      end
    end
  end
end
return {1, ''}
"""
    + _EPILOGUE
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
return live
"""
    + _EPILOGUE
)

# ARGV 3 the number of the hash to read (1 spent, 2 reserved, 10 unsettled, 11 expired holds),
# after ending the holds whose lease ran out. Returns its fields and values.
READ = (
    _PRELUDE
    + """
local found = redis.call('HGETALL', KEYS[tonumber(ARGV[3])])
return found
"""
    + _EPILOGUE
)

# ARGV 3 the scope's field prefix, 4 "1" to only lower ceilings already kept, then
# (key, ceiling) pairs. Returns the JSON of every ceiling now kept there.
CEILINGS = (
    _PRELUDE
    + """
local raw = redis.call('HGET', KEYS[13], ARGV[3])
local kept = {}
if raw then kept = cjson.decode(raw) end
for i = 5, #ARGV, 2 do
  local old = kept[ARGV[i]]
  if ARGV[4] ~= '1' or old == nil or tonumber(ARGV[i + 1]) < tonumber(old) then
    kept[ARGV[i]] = ARGV[i + 1]
  end
end
local encoded = cjson.encode(kept)  -- an empty table is '{}'
redis.call('HSET', KEYS[13], ARGV[3], encoded)
return encoded
"""
    + _EPILOGUE
)

# ARGV 3 the note's field, 4 its text ("" drops the note), 5 "1" to write it only if it is not
# there yet. Returns 1 if the note was written (or dropped), else 0.
NOTE = (
    _PRELUDE
    + """
local done
if ARGV[4] == '' then
  done = redis.call('HDEL', KEYS[16], ARGV[3])
elseif ARGV[5] == '1' then
  done = redis.call('HSETNX', KEYS[16], ARGV[3], ARGV[4])
else
  redis.call('HSET', KEYS[16], ARGV[3], ARGV[4])
  done = 1
end
return done
"""
    + _EPILOGUE
)

# ARGV 3 a field, 4 window seconds. Returns what was committed of the field in the last that
# many seconds by the server's clock.
RECENT = (
    _PRELUDE
    + """
return recent(ARGV[3], now - tonumber(ARGV[4]))
"""
    + _EPILOGUE
)
