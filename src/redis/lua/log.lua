-- tollgate: the sliding window log (src/engine/sliding_log.rs, `Log::decide`), in microseconds.
--
-- State: one sorted set of the last N admitted permits, scored by their timestamps; members
-- are a per-key sequence number, zero-padded so that members of equal score sort in
-- admission order. Scores never decrease in that order (a clock that went backwards stamps
-- new entries with the newest entry's time), so the live entries, those with score > now - W
-- (an entry exactly W old has left; an entry in the future counts as stamped now), are
-- always the newest ones and are counted by one ZCOUNT. For small N: the set holds N
-- entries per key and an admission of cost n adds n members.

local function log_member(seq)
  return string.format('%016.0f', seq)
end

-- The age of an entry stamped `stamp`, seen at `now`: an entry in the future counts as
-- stamped now.
local function log_age(stamp, now)
  if stamp > now then
    return 0
  end
  return now - stamp
end

-- W minus the age of `stamp`, or 0 once it has left.
local function log_left(W, stamp, now)
  local left = W - log_age(stamp, now)
  if left < 0 then
    return 0
  end
  return left
end

-- Lets the key expire once every entry has left, W after the newest one's stamp `newest`
-- (ahead of now when the clock went backwards: a stepped clock, a failover to a replica
-- behind), or deletes it when that has passed already.
local function log_expire(key, W, now, newest)
  if newest - now + W > 0 then
    redis.call('PEXPIRE', key, fmt(idiv(newest - now + W + 999, 1000)))
  else
    redis.call('DEL', key)
  end
end

-- Appends `count` entries stamped `stamp`, members numbered from `first`, and keeps the last N.
local function log_append(key, N, W, now, stamp, first, count, expire)
  local score = fmt(stamp)
  local args = {}
  local j = 0
  while j < count do
    args[#args + 1] = score
    args[#args + 1] = log_member(first + j)
    j = j + 1
    -- ZADD in chunks: unpack is bounded by Lua's C stack.
    if #args >= 1000 or j == count then
      redis.call('ZADD', key, unpack(args))
      args = {}
    end
  end
  -- Keep the last N entries only: no more can ever be live at once.
  redis.call('ZREMRANGEBYRANK', key, 0, -(N + 1))
  if expire then
    log_expire(key, W, now, stamp)
  end
end

-- The newest entry's stamp and sequence number (nil for an empty log).
local function log_newest(key)
  local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if newest[1] then
    return tonumber(newest[2]), tonumber(newest[1])
  end
  return nil, nil
end

-- The number of live entries (at most N), and the newest entry's stamp and sequence number
-- (nil for an empty log).
local function log_scan(key, N, W, now)
  local live = redis.call('ZCOUNT', key, '(' .. fmt(now - W), '+inf')
  if live > N then
    live = N
  end
  return live, log_newest(key)
end

-- Where the next entries go: stamped now, or at the newest entry's stamp when that is ahead
-- of now (so stamps never decrease), numbered after the newest entry.
local function log_next(newest_stamp, newest_seq, now)
  local stamp = now
  if newest_stamp and newest_stamp > now then
    stamp = newest_stamp
  end
  local first = 0
  if newest_seq then
    first = newest_seq + 1
  end
  return stamp, first
end

local function log_band(key, N, W, now, cost)
  -- The newest entry: its score and member (the highest sequence number).
  local live, newest_stamp, newest_seq = log_scan(key, N, W, now)
  local reset_now = 0
  if newest_stamp then
    reset_now = log_left(W, newest_stamp, now)
  end
  if live + cost <= N then
    local stamp, first = log_next(newest_stamp, newest_seq, now)
    return {
      ok = true,
      limit = N,
      remaining = N - live - cost,
      -- The new entries are the newest.
      reset = W,
      reset_now = reset_now,
      -- A reservation's mark: the stamp of its entries.
      mark = stamp,
      write = function(expire)
        log_append(key, N, W, now, stamp, first, cost, expire)
      end,
    }
  end
  -- The entry that must leave for the request to fit: the (live + cost - N)-th oldest live
  -- one, counted from the newest end of the set.
  local leave = live + cost - N
  local rank = leave - live - 1
  local entry = redis.call('ZRANGE', key, rank, rank, 'WITHSCORES')
  return {
    ok = false,
    limit = N,
    remaining = N - live,
    retry = log_left(W, tonumber(entry[2]), now),
    reset = reset_now,
  }
end

-- Settles a reservation whose entries were stamped `mark`: gives back `give` permits by
-- removing up to that many entries stamped `mark` while it is live, or charges `take` more
-- entries stamped as an admission's would be, up to N live (one of give and take is 0).
-- Reads now; returns the write (nil when nothing changes).
local function log_settle(key, N, W, now, mark, give, take, expire)
  if give > 0 then
    if log_age(mark, now) >= W then
      return nil
    end
    local score = fmt(mark)
    local stamped = redis.call('ZCOUNT', key, score, score)
    if give > stamped then
      give = stamped
    end
    if give == 0 then
      return nil
    end
    -- The entries stamped `mark` are consecutive in the set (ordered by stamp, then by
    -- sequence number); remove the newest `give` of them, so the rest stays in order.
    local last = redis.call('ZCOUNT', key, '-inf', score) - 1
    return function()
      redis.call('ZREMRANGEBYRANK', key, last - give + 1, last)
      if expire then
        -- The newest entry may be older now: the key matters until it leaves (a set left
        -- empty is gone already).
        local newest_stamp = log_newest(key)
        if newest_stamp then
          log_expire(key, W, now, newest_stamp)
        end
      end
    end
  end
  local live, newest_stamp, newest_seq = log_scan(key, N, W, now)
  local count = N - live
  if take < count then
    count = take
  end
  if count == 0 then
    return nil
  end
  local stamp, first = log_next(newest_stamp, newest_seq, now)
  return function()
    log_append(key, N, W, now, stamp, first, count, expire)
  end
end
