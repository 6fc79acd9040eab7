-- tollgate: one band decided by its algorithm, and one key's bands merged into its decision
-- (src/engine/composite.rs), for both requests the script decides: one key under its policy
-- (decide.lua) and several keys at once, all or nothing (parts.lua). Preceded by arith.lua,
-- gcra.lua, counter.lua and log.lua.

-- Band `algorithm` ('tb', 'sc' or 'sl'; N permits, window W, interval T) of `key` deciding a
-- request of `cost` at `now`: what the algorithm's file returns, nil for an unknown algorithm.
local function band_decide(key, algorithm, N, W, T, now, cost)
  if algorithm == 'tb' then
    return gcra_band(key, N, T, now, cost)
  elseif algorithm == 'sc' then
    return counter_band(key, N, W, now, cost)
  elseif algorithm == 'sl' then
    return log_band(key, N, W, now, cost)
  end
  return nil
end

-- The permits band `algorithm` of `key` has in use at `now`, as a move to another policy
-- carries them (src/engine/state.rs, `in_use`): its limit less what a request of cost 1
-- finds available; a sliding counter's estimate rounded up. nil for an unknown algorithm.
local function band_in_use(key, algorithm, N, W, T, now)
  if algorithm == 'sc' then
    return counter_in_use(key, N, W, now)
  end
  local band = band_decide(key, algorithm, N, W, T, now, 1)
  if not band then
    return nil
  end
  local available = band.remaining
  if band.ok then
    available = available + 1
  end
  if available > N then
    return 0
  end
  return N - available
end

-- One key's decision from its `bands`' on a request of `cost`, `all` when every band admits
-- it: { allowed (0 or 1), remaining, limit, retry_after, reset_after }. The merge: the
-- smallest remaining (the first band wins a tie) and its limit, the longest retry_after, the
-- longest reset_after. Refused, a band that would admit reports what it has available now,
-- unspent: what the admission would have left plus what it would take.
local function band_verdict(bands, all, cost)
  local remaining, limit, retry, reset = INF, 0, 0, 0
  for i = 1, #bands do
    local band = bands[i]
    local r, t, s = band.remaining, 0, band.reset
    if not all then
      if band.ok then
        r, s = band.remaining + cost, band.reset_now
      else
        t = band.retry
      end
    end
    if r < remaining then
      remaining, limit = r, band.limit
    end
    if t > retry then
      retry = t
    end
    if s > reset then
      reset = s
    end
  end
  return { all and 1 or 0, remaining, limit, retry, reset }
end
