-- tollgate: one decision for one key under a whole policy, all bands at once
-- (src/engine/composite.rs for how the bands merge), the settling of a reservation, several
-- keys at once (parts.lua), or a key's move to another policy (record.lua). Preceded by
-- arith.lua, gcra.lua, counter.lua, log.lua, band.lua, tokens.lua, record.lua and parts.lua in
-- the script Redis runs.
--
-- KEYS[i]      band i's key; every key of one call shares a {hash tag}, so one slot holds
--              them all in a Redis Cluster.
-- ARGV[1]      now in microseconds, or '' to read Redis TIME (the normal case: one clock for
--              every application server). An injected now is for tests: no key gets an expiry.
-- ARGV[2]      what is asked:
--              'acquire'  a request of cost n = ARGV[3] >= 1;
--              'peek'     what a request of cost 1 would get (ARGV[3] is 1); nothing written;
--              'reserve'  as 'acquire', and the reply carries each band's mark;
--              'refund'   settle a reservation, giving back g = ARGV[3] >= 1 permits;
--              'charge'   settle a reservation, charging e = ARGV[3] >= 1 more permits;
--              'lease'    reserve k permits, 1 <= k <= m = ARGV[3], as many as every band
--                         has (a request of cost 1 decides whether there is a lease at all);
--                         the reply carries each band's mark and k;
--              'return'   as 'refund', only while the lease's token names the lease.
--              'parts', 'parts-peek', 'parts-reserve'  several keys at once, all or
--                         nothing: see parts.lua;
--              'convert@' a key's move to another policy, 'publish' the policy one server
--                         set for all: see record.lua.
--              Any of the first seven may end in '@' (a limiter with per-key policies): the
--              last key is then the key's record, and the last two arguments when the
--              policy was chosen (an instant, or '-' and an age, in us: see record.lua) and
--              its text, after everything below. A record naming another policy decides
--              nothing: the reply is { 'tier', 'move' or 'follow', the record's text, when
--              it was chosen }; a settle ('refund@', 'charge@') changes nothing then (0):
--              its policy is the reservation's, and the state is another's now. A write
--              refreshes a record naming its policy; a settle never creates one.
-- ARGV[4 + 4(i - 1) ...]  band i: algorithm ('tb', 'sl' or 'sc'), permits N, window W (us),
--              interval T (us; the token bucket's, rounded up; 0 for the others).
-- ARGV[3 + 4 B + i]       ('refund', 'charge' and 'return') band i's mark, from the
--              reservation, for B bands.
-- 'lease' and 'return' take one key more, after the bands': the key's hash of lease tokens,
-- a field per limiter instance naming its latest lease: '<serial>:<deadline>', the deadline
-- (us, on the script's clock) from which the token is no longer needed; a reset deletes the
-- hash with the bands. 'lease' then ends with ARGV[4 + 4 B] (the new lease's serial),
-- ARGV[5 + 4 B] (the token's lifetime in ms, 1 to 2^40) and ARGV[6 + 4 B] (the instance's
-- field); 'return' with ARGV[4 + 5 B] (the serial of the lease given back) and ARGV[5 + 5 B]
-- (the field).
-- 'reserve', 'refund' and 'charge' take one key more too: the key's hash of reservation
-- tokens, a field '<instance>:<serial>' per reservation admitted and not yet settled, whose
-- value is '<serial>:<deadline>' (the deadline: twice the longest window and a second after
-- the reservation, when no band counts it any more). 'reserve' ends with ARGV[4 + 4 B] (the
-- serial) and ARGV[5 + 4 B] (the instance); 'refund' and 'charge' with ARGV[4 + 5 B] and
-- ARGV[5 + 5 B], the same. A refund applies only while the token is there; a charge applies
-- anyway (it only ever spends more); both delete it. With per-key policies ('refund@',
-- 'charge@'), either applies only while the key's record names the reservation's policy
-- (or there is no record).
--
-- Reply: { allowed (0 or 1), remaining, limit, retry_after (us), reset_after (us) }, and for
-- 'reserve' one mark per band after them (0 when refused), for 'lease' the marks and k (0
-- when refused); 1 for 'charge' (0 for 'charge@' when the record names another policy); for
-- 'refund' and 'return' 1, or 0 when the token is gone
-- (settled or returned already, expired, or Redis lost its data since), which changes
-- nothing. Every band is read and decided before anything is written, and only an admission
-- by every band writes: a refusal changes nothing anywhere. A settle applies every band's
-- own rule, unconditionally.

forget_records()

if redis.replicate_commands then
  -- Redis 3.2 to 4: replicate the writes, not the script (it reads TIME). A no-op from 5 on.
  redis.replicate_commands()
end

local now, expire
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  expire = true
else
  now = tonumber(ARGV[1])
  expire = false
end
local op = ARGV[2]
local amount = tonumber(ARGV[3])
local record, policy_text, chosen
if string.sub(op, -1) == '@' then
  op = string.sub(op, 1, -2)
  record, policy_text, chosen = KEYS[#KEYS], ARGV[#ARGV], chosen_at(ARGV[#ARGV - 1], now)
  if not chosen or not policy_text or policy_text == '' then
    return redis.error_reply('tollgate: ' .. op .. '@ takes when its policy was chosen and the policy, got '
      .. tostring(ARGV[#ARGV - 1]) .. ' and ' .. tostring(ARGV[#ARGV]))
  end
end

if op == 'parts' or op == 'parts-peek' or op == 'parts-reserve' then
  return decide_parts(now, expire, op)
end
if op == 'convert' and record then
  return convert_tier(now, expire)
end
if op == 'publish' then
  return publish_policy(now)
end

-- The number of bands: a hash of tokens follows their keys for these, and the record.
local nb = #KEYS
if op == 'lease' or op == 'return' or op == 'reserve' or op == 'refund' or op == 'charge' then
  nb = nb - 1
end
local settle = op == 'refund' or op == 'charge' or op == 'return'
if record then
  nb = nb - 1
  if nb < 1 then
    return redis.error_reply('tollgate: ' .. op .. '@ names no band')
  end
  if settle then
    local _, recorded = read_record(record)
    if recorded and recorded ~= policy_text then
      return 0
    end
  else
    local conflict = record_conflict(record, policy_text, chosen)
    if conflict then
      return conflict
    end
  end
end

-- Band i's algorithm, permits, window and interval.
local function spec(i)
  local at = 3 + 4 * (i - 1)
  return ARGV[at + 1], tonumber(ARGV[at + 2]), tonumber(ARGV[at + 3]), tonumber(ARGV[at + 4])
end

-- The longest band's window.
local function longest_window()
  local longest = 0
  for i = 1, nb do
    local _, _, W = spec(i)
    if W > longest then
      longest = W
    end
  end
  return longest
end

-- After a write: the key's record names the policy the state is under now. A settle only
-- refreshes a record that names its policy (a record lost while the state lives is not made
-- up from a reservation's policy).
local function recorded_write()
  if not record then
    return
  end
  if settle then
    local _, recorded = read_record(record)
    if recorded ~= policy_text then
      return
    end
  end
  write_record(record, policy_text, chosen, longest_window(), expire)
end

-- Every band's settle of the reservation whose marks follow the bands' arguments, giving
-- back `give` or charging `take`: the writes, once every band is read (nil and a message
-- for an unknown algorithm, with nothing written).
local function settle_writes(give, take)
  local writes = {}
  for i = 1, nb do
    local algorithm, N, W, T = spec(i)
    local mark = tonumber(ARGV[3 + 4 * nb + i])
    local write
    if algorithm == 'tb' then
      write = gcra_settle(KEYS[i], N, T, now, mark, give, take, expire)
    elseif algorithm == 'sc' then
      write = counter_settle(KEYS[i], N, W, now, mark, give, take, expire)
    elseif algorithm == 'sl' then
      write = log_settle(KEYS[i], N, W, now, mark, give, take, expire)
    else
      return nil, 'tollgate: unknown algorithm ' .. tostring(algorithm)
    end
    if write then
      writes[#writes + 1] = write
    end
  end
  return writes
end

if op == 'refund' or op == 'charge' or op == 'return' then
  local give, take = 0, 0
  if op == 'charge' then
    take = amount
  else
    give = amount
  end
  local token = KEYS[nb + 1]
  local field = ARGV[5 + 5 * nb]
  if op == 'return' then
    if token_serial(redis.call('HGET', token, field)) ~= ARGV[4 + 5 * nb] then
      -- Returned already, or the token expired, or Redis lost its data since the lease was
      -- taken (a restart without persistence): nothing of this lease is counted to give back.
      return 0
    end
  else
    field = field .. ':' .. ARGV[4 + 5 * nb]
    if op == 'refund' and redis.call('HEXISTS', token, field) == 0 then
      -- Settled already, or Redis lost the reservation since (a restart without persistence,
      -- a FLUSHALL, a failover to a replica that never had it, an eviction): the state does
      -- not count it, and a refund would give back permits it never held.
      return 0
    end
  end
  -- Every band is read before anything is written, so a failed settle changes nothing.
  local writes, err = settle_writes(give, take)
  if not writes then
    return redis.error_reply(err)
  end
  delete_token(token, field)
  for i = 1, #writes do
    writes[i]()
  end
  recorded_write()
  return 1
end

local peek = op == 'peek'
local lease = op == 'lease'
local reserve = op == 'reserve' or lease
if not (peek or reserve or op == 'acquire') then
  return redis.error_reply('tollgate: unknown request ' .. tostring(op))
end
local cost = amount
local token_ttl
if lease then
  cost = 1
  -- Checked before anything is written: a call that fails changes nothing.
  token_ttl = tonumber(ARGV[5 + 4 * nb])
  if not token_ttl or token_ttl < 1 or token_ttl > 2 ^ 40 then
    return redis.error_reply('tollgate: lease token lifetime out of range: ' .. tostring(ARGV[5 + 4 * nb]))
  end
end

-- Every band's decision of a request of `cost` (nil and a message for an unknown
-- algorithm), and whether all of them admit it.
local function decide_all(cost)
  local bands = {}
  local all = true
  for i = 1, nb do
    local algorithm, N, W, T = spec(i)
    local band = band_decide(KEYS[i], algorithm, N, W, T, now, cost)
    if not band then
      return nil, 'tollgate: unknown algorithm ' .. tostring(algorithm)
    end
    bands[i] = band
    if not band.ok then
      all = false
    end
  end
  return bands, all
end

local bands, all = decide_all(cost)
if not bands then
  return redis.error_reply(all)
end

if lease and all then
  -- Every band admits one permit and has `remaining` more: the lease takes as many as the
  -- tightest band has, up to what was asked, decided again as one request of that cost
  -- (which every band admits, the state being the same).
  local k = amount
  for i = 1, nb do
    if bands[i].remaining + 1 < k then
      k = bands[i].remaining + 1
    end
  end
  if k > 1 then
    cost = k
    bands, all = decide_all(cost)
  end
end

local reply = band_verdict(bands, all, cost)
if all then
  -- The token this call writes, if any, as { field, serial, life }: decided before the bands
  -- are written, and its hash checked then, so that a wrong type there fails the call whole.
  local token
  if lease then
    if cost > 1 then
      -- The lease holds permits beyond its first request's: its token names it, so that
      -- they are given back once at most, and only to the state that counts them.
      -- One hash per key, a field per limiter instance: a reset deletes every instance's
      -- token with the state, so no lease taken before it is given back to the fresh one.
      -- Tokens of instances that are gone (closed with their lease spent, or dead) are
      -- dropped once their deadline has passed, a bounded number per call.
      token = { ARGV[6 + 4 * nb], ARGV[4 + 4 * nb], token_ttl * 1000 }
    end
  elseif reserve then
    -- The reservation's token: a refund applies only while it is there, so never to a state
    -- that lost the reservation.
    local serial = ARGV[4 + 4 * nb]
    token = { ARGV[5 + 4 * nb] .. ':' .. serial, serial, reservation_life(longest_window()) }
  end
  if token then
    local wrong = token_type_error(KEYS[nb + 1])
    if wrong then
      return wrong
    end
  end
  if not peek then
    for i = 1, #bands do
      bands[i].write(expire)
    end
    recorded_write()
  end
  if reserve then
    for i = 1, #bands do
      reply[5 + i] = bands[i].mark
    end
  end
  if lease then
    reply[6 + #bands] = cost
  end
  if token then
    write_token(KEYS[nb + 1], token[1], token[2], token[3], now, expire)
  end
  return reply
end

if reserve then
  for i = 1, #bands do
    reply[5 + i] = 0
  end
end
if lease then
  reply[6 + #bands] = 0
end
return reply
