-- tollgate: the token bucket as GCRA (src/token_bucket.rs, `Gcra::decide`), in microseconds.
--
-- State: one string key holding the theoretical arrival time (TAT) as an integer; a missing
-- key is a full bucket (TAT 0). T (the interval, rounded up) comes from Rust; B = N * T.

local function gcra_band(key, N, T, now, cost)
  local B = N * T
  local tat = tonumber(redis.call('GET', key) or '0') or 0
  -- debt = max(tat, now) - now, clamped to B: a TAT beyond now + B (the clock went
  -- backwards) counts as the furthest valid one.
  local debt = tat - now
  if debt < 0 then
    debt = 0
  elseif debt > B then
    debt = B
  end
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
        if expire then
          -- The key vanishes when the bucket is full again: reset_after, rounded up to ms.
          redis.call('SET', key, fmt(tat_new), 'PX', fmt(idiv(new_debt + 999, 1000)))
        else
          redis.call('SET', key, fmt(tat_new))
        end
      end,
    }
  end
  return {
    ok = false,
    limit = N,
    remaining = idiv(B - debt, T),
    retry = new_debt - B,
    reset = debt,
  }
end
