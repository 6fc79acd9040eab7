-- tollgate: per-key policies (src/redis/tiers.rs). A key's record, '<prefix>:{<key>}:policy',
-- holds '<at>|<text>': the policy its state is under (its text) and when it was chosen (at,
-- in us on the script's clock). A request names its policy and when it was chosen; under
-- another policy than the record's it is not decided: a later choice moves the state first
-- ('convert', carrying the permits in use as src/engine/state.rs's `Carry` does), an earlier
-- one is decided under the record's policy; what the new state cannot count is kept beside
-- it (carry.lua). Preceded by band.lua, tokens.lua and carry.lua.

-- A policy set live ('publish') is dated this much later than its instant: later than any
-- resolver's answer (instants stay below 2^52 us), so that it outranks every answer, as
-- set_policy replaces the resolver in process; and below 2^53, where doubles stay exact.
local LIVE_RANK = 4503599627370496

-- When a choice was made, from its argument: an instant (us, below 2^53), or '-' and its
-- age (us, at most `now`) at `now` (a resolver's answer, dated on this script's clock, so
-- that servers' clocks need not agree). nil for anything else.
local function chosen_at(arg, now)
  if type(arg) ~= 'string' then
    return nil
  end
  if string.sub(arg, 1, 1) == '-' then
    local age = tonumber(string.sub(arg, 2))
    if not age or age < 0 or age > now or age % 1 ~= 0 then
      return nil
    end
    return now - age
  end
  local at = tonumber(arg)
  if not at or at < 0 or at >= 2 * LIVE_RANK or at % 1 ~= 0 then
    return nil
  end
  return at
end

-- The records read by this call, by key, so that a write after a check reads nothing more.
-- Emptied at the start of every call (decide.lua): loaded as a function library, the code's
-- top-level values live from one call to the next.
local records_read = {}
local function forget_records()
  records_read = {}
end

-- The record at `key`: when its policy was chosen, and its text (nil for no record).
local function read_record(key)
  local read = records_read[key]
  if not read then
    local value = redis.call('GET', key)
    read = {}
    if value then
      local at, text = string.match(value, '^(%d+)|(.*)$')
      read.at, read.text = tonumber(at), text
    end
    records_read[key] = read
  end
  return read.at, read.text
end

-- Whether a request under the policy `text`, chosen at `at`, may be decided: nil when it may
-- (no record: a new key, or one whose state has expired; or the record names `text`), else
-- the reply that says why not: { 'tier', 'move' or 'follow', the record's text, when it was
-- chosen } ('move': the request's choice is later, move the state to it first; 'follow': the
-- record's is as late or later, decide under it). `part`, when given, goes after 'tier'.
local function record_conflict(key, text, at, part)
  local recorded_at, recorded = read_record(key)
  if not recorded_at or recorded == text then
    return nil
  end
  local mode = 'follow'
  if at > recorded_at then
    mode = 'move'
  end
  if part then
    return { 'tier', part, mode, recorded, fmt(recorded_at) }
  end
  return { 'tier', mode, recorded, fmt(recorded_at) }
end

-- Writes the record at `key`: the policy `text`, chosen at `at` (a record already naming
-- `text` keeps its date, as the key is under that policy since then and dates derived from
-- answers' ages move with latency; but a policy set live later, an exact date, dates it
-- anew, so that it outranks the resolvers' answers), kept while a state written now may
-- still count anything, with no expiry on an injected clock. A state counts for at most
-- four times its longest window `longest` us (a token bucket charged to twice its burst,
-- whose interval, rounded up, makes the burst up to twice the window), and a reservation's
-- token for twice it and a second: the record is kept that long and a second. It is given
-- twice that life (or what it had left, if longer: never shortened, so that it outlives
-- what a move kept), and rewritten only when it changes, is dated anew, or has less than
-- that left: an admission then reads its time to live instead of writing it, and the
-- record outlives the state.
local function write_record(key, text, at, longest, expire)
  local recorded_at, recorded = read_record(key)
  local life = idiv(4 * longest + 1000000 + 999, 1000)
  if recorded == text and not (at >= LIVE_RANK and at > recorded_at) then
    if not expire or redis.call('PTTL', key) >= life then
      return
    end
    at = recorded_at
  end
  local value = fmt(at) .. '|' .. text
  if expire then
    -- Never shortened: a move may have kept the record alive as long as what it kept
    -- (convert_tier), and a policy applied again must not cut that short.
    local ms = 2 * life
    local left = redis.call('PTTL', key)
    if left > ms then
      ms = left
    end
    redis.call('SET', key, value, 'PX', fmt(ms))
  else
    redis.call('SET', key, value)
  end
  records_read[key] = { at = at, text = text }
end

-- 'publish': stores the policy one server set for every server (src/redis/live.rs), chosen
-- now (dated LIVE_RANK later), unless one chosen no earlier is stored.
-- KEYS[1]  the stored policy, '<chosen>|<text>' as a record.
-- ARGV[3]  the policy's text.
-- Reply: the value stored now, '<chosen>|<text>'.
local function publish_policy(now)
  local text = ARGV[3]
  if #KEYS ~= 1 or #ARGV ~= 3 or not text or not string.find(text, '/', 1, true) then
    return redis.error_reply('tollgate: publish takes a key and a policy')
  end
  if now >= LIVE_RANK then
    return redis.error_reply('tollgate: publish: the clock is beyond 2^52 us')
  end
  local chosen = LIVE_RANK + now
  local stored_at = read_record(KEYS[1])
  if not stored_at or stored_at < chosen then
    redis.call('SET', KEYS[1], fmt(chosen) .. '|' .. text)
  end
  return redis.call('GET', KEYS[1])
end

-- 'convert': moves a key's state from the policy its record names to another, once.
-- KEYS     the old policy's band keys, then the new one's, then the key's hash of
--          reservation tokens, its kept permits (carry.lua), then the record.
-- ARGV[3]  the old policy's number of bands a, then its bands' four arguments each (as
--          decide.lua takes them); then the new one's number b and its bands'; then the old
--          policy's text, when the new one was chosen (us), and the new one's text.
-- Reply: 1 when moved; 2 when there was nothing to move (moved already by another request,
-- or no record); else the record's conflict (see record_conflict) when it names a third
-- policy, or one chosen no earlier than the new one.
local function convert_tier(now, expire)
  local a = tonumber(ARGV[3])
  local b = a and tonumber(ARGV[4 + 4 * a])
  if not a or a < 1 or not b or b < 1 or #KEYS ~= a + b + 3
      or #ARGV ~= 4 + 4 * a + 4 * b + 3 then
    return redis.error_reply('tollgate: convert takes ' .. #KEYS .. ' keys and ' .. #ARGV
      .. ' arguments for ' .. tostring(a) .. ' and ' .. tostring(b) .. ' bands')
  end
  local at = 4 + 4 * a
  local kept_key, record = KEYS[#KEYS - 1], KEYS[#KEYS]
  local old_text, new_text = ARGV[#ARGV - 2], ARGV[#ARGV]
  local chosen = chosen_at(ARGV[#ARGV - 1], now)
  if not chosen then
    return redis.error_reply('tollgate: convert: no instant of choice: ' .. tostring(ARGV[#ARGV - 1]))
  end
  local recorded_at, recorded = read_record(record)
  if not recorded_at or recorded == new_text then
    return 2
  end
  if recorded ~= old_text or recorded_at >= chosen then
    return record_conflict(record, new_text, chosen)
  end
  -- Every band's algorithm is known before anything is written: a failed call changes
  -- nothing.
  for i = 1, a + b do
    local o = 4 + 4 * (i - 1)
    if i > a then
      o = o + 1
    end
    local algorithm = ARGV[o]
    if algorithm ~= 'tb' and algorithm ~= 'sc' and algorithm ~= 'sl' then
      return redis.error_reply('tollgate: unknown algorithm ' .. tostring(algorithm))
    end
  end
  -- Every old band's permits in use, and what earlier moves kept, read before anything is
  -- written.
  local fresh = {}
  for i = 1, a do
    local o = 4 + 4 * (i - 1)
    local W = tonumber(ARGV[o + 2])
    local n = band_in_use(KEYS[i], ARGV[o], tonumber(ARGV[o + 1]), W, tonumber(ARGV[o + 3]), now)
    fresh[i] = { W = W, n = n }
  end
  local old = kept_read(kept_key, now)
  local carry, built_at = carry_built_from(fresh, old, now)
  -- The old state goes; so does anything under the new policy's keys that the record did
  -- not name (left by a reset that raced a move): the record is what counts.
  for i = 1, a + b do
    redis.call('DEL', KEYS[i])
  end
  -- Reservations made on the old state are settled on no other: their tokens go, so a
  -- refund gives nothing back; a charge takes nothing while the record names another
  -- policy than theirs (decide.lua).
  redis.call('DEL', KEYS[a + b + 1])
  -- Each new band starts with what it must count of the carry (the most permits in use
  -- among the bands whose window is no longer than its own), spent at the instant the carry
  -- is as of, at most its permits.
  local longest = 0
  local bands = {}
  for j = 1, b do
    local o = at + 1 + 4 * (j - 1)
    local band = {
      key = KEYS[a + j], algorithm = ARGV[o], N = tonumber(ARGV[o + 1]),
      W = tonumber(ARGV[o + 2]), T = tonumber(ARGV[o + 3]),
    }
    bands[j] = band
    if band.W > longest then
      longest = band.W
    end
    local spent = spent_within(carry, band.W)
    if spent > band.N then
      spent = band.N
    end
    if spent > 0 then
      -- A fresh band admits any cost up to its permits.
      local decided = band_decide(band.key, band.algorithm, band.N, band.W, band.T, built_at,
        spent)
      if decided.ok then
        decided.write(expire)
      end
    end
  end
  -- What the new state does not count of what it was built from is kept, until it comes
  -- back: the next move counts it too.
  local counted = {}
  for j = 1, b do
    local band = bands[j]
    counted[j] = {
      W = band.W,
      n = band_in_use(band.key, band.algorithm, band.N, band.W, band.T, now),
    }
  end
  local kept_ms = kept_write(kept_key, carry_to_keep(fresh, old, counted, now), now, expire)
  write_record(record, new_text, chosen, longest, expire)
  -- The record outlives what is kept: a request under another policy finds it, and moves
  -- the key, counting what is kept, rather than deciding on a fresh state.
  if kept_ms > 0 and redis.call('PTTL', record) < kept_ms then
    redis.call('PEXPIRE', record, fmt(kept_ms))
  end
  return 1
end
