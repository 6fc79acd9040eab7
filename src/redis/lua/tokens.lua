-- tollgate: the hashes of tokens next to a key's state, naming the leases and reservations
-- that state counts, so that each is given back once at most and only to the state that
-- counts it (decide.lua for their layout). Preceded by arith.lua; decide.lua and parts.lua
-- use them.

-- A token's value (a lease's or a reservation's) is '<serial>:<deadline>': the serial number
-- of the lease or reservation it names, and the instant (us) from which it is no longer
-- needed. The serial of `value` (nil for a missing field, which Redis gives as false).
local function token_serial(value)
  if not value then
    return nil
  end
  return string.match(value, '^(%d+)')
end

-- An error reply when `token` holds a value of another type than a hash of tokens (one that
-- another program wrote under the limiter's names), nil otherwise. Checked before a script
-- writes anything: Redis keeps the writes a failing script made before its error, so a call
-- that failed only at its token would have spent its bands' permits.
local function token_type_error(token)
  local kind = redis.call('TYPE', token)['ok']
  if kind == 'hash' or kind == 'none' then
    return nil
  end
  return redis.error_reply('WRONGTYPE tollgate: ' .. token .. ' holds a ' .. kind
    .. ', not a hash of tokens')
end

-- The field of a hash of tokens that keeps where the walk of `reclaim_tokens` is.
local TOKEN_CURSOR = '#'

-- Drops the tokens of `token` (a key's hash of lease or reservation tokens) whose deadline is
-- at or before `now`, and any value it cannot read: one HSCAN step of about 16 fields per
-- call, resumed where the previous call stopped (the cursor is kept in the hash), so that
-- every token is looked at within a bounded number of calls. A small hash (Redis's compact
-- encoding, up to 128 fields by default) is returned whole by one step.
local function reclaim_tokens(token, now)
  local cursor = redis.call('HGET', token, TOKEN_CURSOR) or '0'
  local scan = redis.call('HSCAN', token, cursor, 'COUNT', 16)
  local items = scan[2]
  for j = 1, #items, 2 do
    if items[j] ~= TOKEN_CURSOR then
      local deadline = tonumber(string.match(items[j + 1], ':(%d+)$'))
      if not deadline or deadline <= now then
        redis.call('HDEL', token, items[j])
      end
    end
  end
  if scan[1] == '0' then
    redis.call('HDEL', token, TOKEN_CURSOR)
  else
    redis.call('HSET', token, TOKEN_CURSOR, scan[1])
  end
end

-- Writes the token `field` = '<serial>:<deadline>' into `token` (a key's hash of lease or
-- reservation tokens), needed for `life` us from `now`: first drops expired tokens (a
-- bounded number), then sets the field, and when `expire` (on Redis TIME) lets the hash live
-- as long as its longest-lived token (extended, never shortened).
local function write_token(token, field, serial, life, now, expire)
  reclaim_tokens(token, now)
  local ttl = idiv(life + 999, 1000)
  -- Read before the field is set: -2 when the hash does not exist yet.
  local before = expire and redis.call('PTTL', token)
  redis.call('HSET', token, field, serial .. ':' .. fmt(now + life))
  if expire then
    if before == -2 or (before >= 0 and before < ttl) then
      redis.call('PEXPIRE', token, fmt(ttl))
    end
  else
    -- Injected time: Redis's own expiry does not follow it; the deadlines do.
    redis.call('PERSIST', token)
  end
end

-- Deletes the token `field` of `token`, and the hash when only the walk's cursor is left.
local function delete_token(token, field)
  redis.call('HDEL', token, field)
  if redis.call('HLEN', token) == 1 then
    redis.call('HDEL', token, TOKEN_CURSOR)
  end
end

-- How long (us) a reservation's token is needed under bands whose longest window is
-- `longest`: no band counts the reservation two longest windows after it (a bucket's debt is
-- at most 2B, a log forgets after W, a counter after 2W), and a second more.
local function reservation_life(longest)
  return 2 * longest + 1000000
end
