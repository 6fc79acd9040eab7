-- tollgate: the sliding window counter (src/engine/sliding_counter.rs, `Counter::decide`), in
-- microseconds.
--
-- State: one hash with fields i (the window index the counts belong to), c (the count of
-- window i) and p (the count of window i - 1); a missing key is the fresh state (0, 0, 0).
-- Windows are aligned to multiples of W from the clock's zero (the Unix epoch under Redis
-- TIME). The key expires when both counts have rolled out: two windows after the start of the
-- window it stores, which may be ahead of now's. The current count may reach 2N (a
-- reservation settled past the limit): the estimate then admits nothing until it rolls out.

-- floor(previous * left / W): the previous window's weight in whole permits.
local function counter_carried(W, previous, left)
  local q = muldiv(previous, left, W)
  return q
end

-- The longest `left` at which floor(previous * left / W) <= spare:
-- ceil((spare + 1) * W / previous) - 1, or INF when previous is 0.
local function counter_longest_left(W, previous, spare)
  if previous == 0 then
    return INF
  end
  local q, r = muldiv(spare + 1, W, previous)
  if q == INF then
    return INF
  end
  if r > 0 then
    q = q + 1
  end
  return q - 1
end

-- Nanoseconds (here microseconds) until both counts have rolled out, `left` before the end
-- of the window.
local function counter_settles_in(W, current, previous, left)
  if current > 0 then
    return left + W
  elseif previous > 0 then
    return left
  end
  return 0
end

-- For a refused request: the wait until used + cost <= N, if nothing else is admitted.
local function counter_retry_after(N, W, current, previous, left, cost)
  local spare = N - (current + cost)
  if spare >= 0 then
    local longest = counter_longest_left(W, previous, spare)
    if longest >= 1 then
      return left - longest
    end
  end
  -- In the next window the current count is the previous one and nothing is current.
  local next_spare = N - cost
  if next_spare < 0 then
    next_spare = 0
  end
  local longest = counter_longest_left(W, current, next_spare)
  if longest >= W then
    return left
  elseif longest >= 1 then
    return left + W - longest
  end
  return left + W
end

-- The stored counts rolled to now's window: index, elapsed, current, previous. A stored
-- window later than now's (the clock went backwards) is decided at its start: zero elapsed.
local function counter_roll(key, W, now)
  local raw = redis.call('HMGET', key, 'i', 'c', 'p')
  local si, sc, sp = tonumber(raw[1]) or 0, tonumber(raw[2]) or 0, tonumber(raw[3]) or 0
  local index = idiv(now, W)
  local elapsed = now - index * W
  if si > index then
    return si, 0, sc, sp
  elseif si == index then
    return index, elapsed, sc, sp
  elseif si + 1 == index then
    return index, elapsed, 0, sc
  end
  return index, elapsed, 0, 0
end

-- The permits in use at `now`, as a move to another policy carries them
-- (`Counter::in_use`): the weighted estimate rounded up (a decision rounds the previous
-- window's share down, admitting what it has room for; a move counts every permit partly
-- in use as spent), at most N.
local function counter_in_use(key, N, W, now)
  local _, elapsed, current, previous = counter_roll(key, W, now)
  local q, r = muldiv(previous, W - elapsed, W)
  if r > 0 then
    q = q + 1
  end
  local used = current + q
  if used > N then
    used = N
  end
  return used
end

-- Stores the counts of window `index`, seen at `now`.
local function counter_store(key, W, now, index, current, previous, expire)
  redis.call('HSET', key, 'i', fmt(index), 'c', fmt(current), 'p', fmt(previous))
  if expire then
    -- Both counts have rolled out when window index + 2 starts. Measured from the stored
    -- window, not from now: it is ahead of now's when the clock went backwards.
    redis.call('PEXPIRE', key, fmt(idiv((index + 2) * W - now + 999, 1000)))
  end
end

local function counter_band(key, N, W, now, cost)
  local index, elapsed, current, previous = counter_roll(key, W, now)
  local left = W - elapsed
  local used = current + counter_carried(W, previous, left)
  local available = N - used
  if available < 0 then
    available = 0
  end
  local settles = counter_settles_in(W, current, previous, left)
  if cost <= available then
    return {
      ok = true,
      limit = N,
      remaining = available - cost,
      -- Both counts are zero from the start of window index + 2.
      reset = left + W,
      reset_now = settles,
      -- A reservation's mark: the start of the window it counted in.
      mark = index * W,
      write = function(expire)
        counter_store(key, W, now, index, current + cost, previous, expire)
      end,
    }
  end
  return {
    ok = false,
    limit = N,
    remaining = available,
    retry = counter_retry_after(N, W, current, previous, left, cost),
    reset = settles,
  }
end

-- Settles a reservation counted in the window starting at `mark`: gives back `give` permits
-- to that window's count while it is the current or the previous one, or charges `take`
-- more to the current window (one of them is 0), up to a count of 2N. Reads now; returns
-- the write (nil when nothing changes).
local function counter_settle(key, N, W, now, mark, give, take, expire)
  local index, _, current, previous = counter_roll(key, W, now)
  if give > 0 then
    local mi = idiv(mark, W)
    if mi == index then
      if give > current then
        give = current
      end
      current = current - give
    elseif mi + 1 == index then
      if give > previous then
        give = previous
      end
      previous = previous - give
    else
      give = 0
    end
    if give == 0 then
      -- Nothing given back: the stored state decides as its rolled form does.
      return nil
    end
  else
    current = current + take
    if current > 2 * N then
      current = 2 * N
    end
  end
  return function()
    counter_store(key, W, now, index, current, previous, expire)
  end
end
