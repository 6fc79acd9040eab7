-- tollgate: the permits a key's move to another policy carries (src/engine/state.rs,
-- `Carry`), and what the new state could not count of them, kept beside the key until
-- those permits have come back (`KeptCarry`), so that a change undone within a window gives
-- nothing back. The rules are the in-process ones, step for step, so that a key moves on
-- Redis as it does in process; record.lua's convert uses them. Preceded by arith.lua.
--
-- A carry is a list of bands { W = window (us), n = permits in use }, what a new band of
-- window w must count of it the most of the bands no longer than w. A kept carry is a list of
-- bands { W, n, c = when they were counted (every one spent by then, within W before), u =
-- when they have all come back (us) }, stored at '<prefix>:{<key>}:kept' as
-- 'W:n:c:u,W:n:c:u,...'; what a new band of window w must count of it is the count of the
-- band of the longest window no longer than w: it may step down, where the state built then
-- counted the permits kept below in a longer band of its own.

-- Policy::MAX_BANDS, and the most bands a kept carry holds (what two policies' states
-- could not count).
local CARRY_BANDS = 4
local KEPT_BANDS = 8

-- The permits a new band of window W must count of a carry's `bands`: the most in use in
-- any band whose window is no longer.
local function spent_within(bands, W)
  local most = 0
  if bands then
    for i = 1, #bands do
      if bands[i].W <= W and bands[i].n > most then
        most = bands[i].n
      end
    end
  end
  return most
end

-- The permits a new band of window W must count of a kept carry's `bands`: the count of the
-- band of the longest window no longer than W (0 for none).
local function kept_within(bands, W)
  local at, n = -1, 0
  if bands then
    for i = 1, #bands do
      if bands[i].W <= W and bands[i].W > at then
        at, n = bands[i].W, bands[i].n
      end
    end
  end
  return n
end

-- Counts `n` permits of window W in `carry` too (`Carry::merge` of one band): a band of the
-- same window keeps the larger count; a new window takes a free place, or, when every place
-- is taken, is folded into the band of the shortest window, which can only count more.
local function carry_merge(carry, W, n)
  local shortest
  for i = 1, #carry do
    local band = carry[i]
    if band.W == W then
      if n > band.n then
        band.n = n
      end
      return
    end
    if not shortest or band.W < shortest.W then
      shortest = band
    end
  end
  if #carry < CARRY_BANDS then
    carry[#carry + 1] = { W = W, n = n }
    return
  end
  if W < shortest.W then
    shortest.W = W
  end
  if n > shortest.n then
    shortest.n = n
  end
end

-- Counts `other` in `band` too: the larger count, the later instants.
local function kept_fold(band, other)
  if other.n > band.n then
    band.n = other.n
  end
  if other.c > band.c then
    band.c = other.c
  end
  if other.u > band.u then
    band.u = other.u
  end
end

-- Keeps `band` in `kept` (`KeptCarry::push`): a band of the same window keeps the larger
-- count and the later instants; a new window takes a free place, or, when every place is
-- taken, is folded into the band just below it, or, with none below, the band just above
-- it is folded into it at its window.
local function kept_push(kept, band)
  local below, above
  for i = 1, #kept do
    local other = kept[i]
    if other.W == band.W then
      kept_fold(other, band)
      return
    end
    if other.W < band.W and (not below or other.W > below.W) then
      below = other
    end
    if not above or other.W < above.W then
      above = other
    end
  end
  if #kept < KEPT_BANDS then
    kept[#kept + 1] = { W = band.W, n = band.n, c = band.c, u = band.u }
  elseif below then
    kept_fold(below, band)
  else
    kept_fold(above, band)
    above.W = band.W
  end
end

-- The bands of `kept` that still count at `now` (those whose permits have not all come
-- back); nil when none holds permits.
local function kept_live(kept, now)
  local live, any = {}, false
  for i = 1, #kept do
    if kept[i].u > now then
      kept_push(live, kept[i])
      if kept[i].n > 0 then
        any = true
      end
    end
  end
  if not any then
    return nil
  end
  return live
end

-- The bands kept at `key` that still count at `now`; nil when none does, or the value is
-- not one this file wrote.
local function kept_read(key, now)
  local value = redis.call('GET', key)
  if type(value) ~= 'string' then
    return nil
  end
  local kept, bound = {}, 2 ^ 50
  for W, n, c, u in string.gmatch(value, '(%d+):(%d+):(%d+):(%d+)') do
    local band = { W = tonumber(W), n = tonumber(n), c = tonumber(c), u = tonumber(u) }
    -- Only what this file writes: a window of at most 2^50 us, instants no later than that
    -- from now, counts below 2^52. Anything else is not counted, and this move's write
    -- replaces it, rather than failing the move after its writes (an expiry Redis refuses).
    if band.W >= 1 and band.W <= bound and band.n < 2 ^ 52 and band.c <= now + bound
        and band.u <= now + bound then
      kept_push(kept, band)
    end
  end
  return kept_live(kept, now)
end

-- Writes `kept` at `key` (deletes it for nil), to expire when its last band has come back;
-- returns that expiry in ms (0 for none).
local function kept_write(key, kept, now, expire)
  if not kept then
    redis.call('DEL', key)
    return 0
  end
  local parts, last = {}, now
  for i = 1, #kept do
    local band = kept[i]
    parts[i] = fmt(band.W) .. ':' .. fmt(band.n) .. ':' .. fmt(band.c) .. ':' .. fmt(band.u)
    if band.u > last then
      last = band.u
    end
  end
  local value = table.concat(parts, ',')
  if not expire then
    redis.call('SET', key, value)
    return 0
  end
  local ms = idiv(last - now + 999, 1000)
  redis.call('SET', key, value, 'PX', fmt(ms))
  return ms
end

-- The windows of `fresh`'s and `old`'s bands, and of `more` (a state's carry), each with
-- what a new band of that window must count of `fresh` and `old`: their permits added, as
-- what is kept is what a state did not count, spent apart from what the state it replaces
-- has in use. In that order, a window repeated as often as it appears.
local function carry_added(fresh, old, more)
  local windows = {}
  for _, bands in ipairs({ fresh or {}, old or {}, more or {} }) do
    for i = 1, #bands do
      local W = bands[i].W
      windows[#windows + 1] = { W = W, n = spent_within(fresh, W) + kept_within(old, W) }
    end
  end
  return windows
end

-- What a new state is built from, and as of when (`built_from`): `fresh` (what the state it
-- replaces has in use) and what was kept, `old`, added, at `now`; with nothing fresh, the
-- kept bands alone (as a carry: at least what each new band must count), as of the latest
-- instant one holding permits was counted. nil when there is nothing.
local function carry_built_from(fresh, old, now)
  local any = false
  for i = 1, #fresh do
    if fresh[i].n > 0 then
      any = true
    end
  end
  if any and old then
    local both = {}
    local added = carry_added(fresh, old, nil)
    for i = 1, #added do
      carry_merge(both, added[i].W, added[i].n)
    end
    return both, now
  elseif any then
    return fresh, now
  elseif old then
    local carry, at = {}, 0
    for i = 1, #old do
      carry_merge(carry, old[i].W, old[i].n)
      if old[i].n > 0 and old[i].c > at then
        at = old[i].c
      end
    end
    if at > now then
      at = now
    end
    return carry, at
  end
  return nil, now
end

-- What to keep once a new state counting `counted` (a carry) at `now` was built from
-- `fresh` and `old` (`to_keep`): for each window of the three, what the state does not count
-- of the two added (its bands of that window or shorter). Kept a window from `now` when
-- `fresh` had permits there, else as the kept bands it comes from; a band lasts as long as
-- every band below it (a step down outlives what it cuts). nil when the state counts
-- everything.
local function carry_to_keep(fresh, old, counted, now)
  local kept = {}
  local added = carry_added(fresh, old, counted)
  for i = 1, #added do
    local W = added[i].W
    local uncounted = added[i].n - spent_within(counted, W)
    if uncounted < 0 then
      uncounted = 0
    end
    local band
    if spent_within(fresh, W) > 0 then
      band = { W = W, n = uncounted, c = now, u = now + W }
    else
      band = { W = W, n = uncounted, c = 0, u = 0 }
      for j = 1, #(old or {}) do
        if old[j].W <= W then
          if old[j].c > band.c then
            band.c = old[j].c
          end
          if old[j].u > band.u then
            band.u = old[j].u
          end
        end
      end
    end
    kept_push(kept, band)
  end
  table.sort(kept, function(x, y)
    return x.W < y.W
  end)
  local last = 0
  for i = 1, #kept do
    if kept[i].u > last then
      last = kept[i].u
    end
    kept[i].u = last
  end
  return kept_live(kept, now)
end
