-- tollgate: the token bucket as GCRA (src/engine/token_bucket.rs, `Gcra::decide`), in microseconds.
--
-- State: one string key holding the theoretical arrival time (TAT) as an integer; a missing
-- key is a full bucket (TAT 0). T (the interval, rounded up) comes from Rust; B = N * T.
-- A settled reservation may charge past the limit: the TAT then runs up to 2B ahead of now.

-- debt = max(tat, now) - now, clamped to 2B: a TAT beyond now + 2B (the clock went
-- backwards) counts as the furthest valid one.
local function gcra_debt(tat, now, B)
  local debt = tat - now
  if debt < 0 then
    return 0
  elseif debt > 2 * B then
    return 2 * B
  end
  return debt
end

-- Stores `tat`, seen at `now`: with an expiry, the key vanishes when the bucket is full
-- again (the debt, rounded up to ms), and a bucket already full is deleted.
local function gcra_store(key, tat, now, expire)
  if not expire then
    redis.call('SET', key, fmt(tat))
  elseif tat > now then
    redis.call('SET', key, fmt(tat), 'PX', fmt(idiv(tat - now + 999, 1000)))
  else
    redis.call('DEL', key)
  end
end

local function gcra_band(key, N, T, now, cost)
  local B = N * T
  local tat = tonumber(redis.call('GET', key) or '0') or 0
  local debt = gcra_debt(tat, now, B)
  local inc = cost * T
  if inc > B then
    inc = B
  end
  local new_debt = debt + inc
  if new_debt <= B then
    local tat_new = now + new_debt
    return {
      ok = true,
      limit = N,
      remaining = idiv(B - new_debt, T),
      reset = new_debt,
      -- What a refusal elsewhere in a composite reports for this band: the debt now.
      reset_now = debt,
      -- A reservation's mark: the TAT it wrote.
      mark = tat_new,
      write = function(expire)
        -- new_debt >= T >= 1: the key gets an expiry of at least 1 ms.
        gcra_store(key, tat_new, now, expire)
      end,
    }
  end
  -- A debt beyond B (charged by a settle) leaves nothing.
  local spare = B - debt
  if spare < 0 then
    spare = 0
  end
  return {
    ok = false,
    limit = N,
    remaining = idiv(spare, T),
    retry = new_debt - B,
    reset = debt,
  }
end

-- Settles a reservation whose admission wrote the TAT `mark`: gives back `give` permits, or
-- charges `take` more (one of them is 0). A refund takes back at most `mark - latest`, the
-- part of the reservation's debt not drained yet, with `latest = max(now, tat - B)` a lower
-- bound of the latest clock an admission decided at (`Gcra::settle`); a charge is admitted
-- whatever the debt, up to a debt of 2B. Reads now; returns the write (nil when nothing
-- changes).
local function gcra_settle(key, N, T, now, mark, give, take, expire)
  local B = N * T
  local tat = tonumber(redis.call('GET', key) or '0') or 0
  local new = tat
  if give > 0 then
    if tat > now then
      -- give <= N: give * T <= B.
      local back = give * T
      local latest = tat - B
      if latest < now then
        latest = now
      end
      local undrained = mark - latest
      if undrained < 0 then
        undrained = 0
      end
      if back > undrained then
        back = undrained
      end
      new = tat - back
      if new < now then
        new = now
      end
    end
  else
    local ceiling = now + 2 * B
    local base = tat
    if base < now then
      base = now
    end
    if base > ceiling then
      base = ceiling
    end
    -- take is at most 2N here, so take * T <= 2B: exact.
    if take > 2 * N then
      take = 2 * N
    end
    local inc = take * T
    if inc > ceiling - base then
      inc = ceiling - base
    end
    if base + inc > tat then
      new = base + inc
    end
  end
  if new ~= tat then
    return function()
      gcra_store(key, new, now, expire)
    end
  end
  return nil
end
