-- tollgate: the token bucket as GCRA (src/token_bucket.rs, `Gcra::decide`), in microseconds.
--
-- State: one string key holding the theoretical arrival time (TAT) as an integer; a missing
-- key is a full bucket (TAT 0). T (the interval, rounded up) comes from Rust; B = N * T.
-- A TAT may run up to 2B ahead of now (a settled reservation charged past the limit).

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
      write = function(expire)
        -- new_debt >= T >= 1: the key gets an expiry of at least 1 ms.
        gcra_store(key, tat_new, now, expire)
      end,
    }
  end
  -- A debt beyond B leaves nothing.
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
