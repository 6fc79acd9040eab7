-- tollgate: one decision for one key under a whole policy, all bands at once
-- (src/composite.rs for how the bands merge), or the settling of a reservation. Preceded by
-- arith.lua, gcra.lua, counter.lua and log.lua in the script Redis runs.
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
--              'charge'   settle a reservation, charging e = ARGV[3] >= 1 more permits.
-- ARGV[4 + 4(i - 1) ...]  band i: algorithm ('tb', 'sl' or 'sc'), permits N, window W (us),
--              interval T (us; the token bucket's, rounded up; 0 for the others).
-- ARGV[3 + 4 #KEYS + i]   ('refund' and 'charge' only) band i's mark, from the reservation.
--
-- Reply: { allowed (0 or 1), remaining, limit, retry_after (us), reset_after (us) }, and for
-- 'reserve' one mark per band after them (0 when refused); 1 for 'refund' and 'charge'.
-- Every band is read and decided before anything is written, and only an admission by
-- every band writes: a refusal changes nothing anywhere. A settle applies every band's own
-- rule, unconditionally.

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

if op == 'refund' or op == 'charge' then
  local give, take = 0, 0
  if op == 'refund' then
    give = amount
  else
    take = amount
  end
  -- Every band is read before anything is written, so a failed settle changes nothing.
  local writes = {}
  for i = 1, #KEYS do
    local at = 3 + 4 * (i - 1)
    local algorithm = ARGV[at + 1]
    local N, W, T = tonumber(ARGV[at + 2]), tonumber(ARGV[at + 3]), tonumber(ARGV[at + 4])
    local mark = tonumber(ARGV[3 + 4 * #KEYS + i])
    local write
    if algorithm == 'tb' then
      write = gcra_settle(KEYS[i], N, T, now, mark, give, take, expire)
    elseif algorithm == 'sc' then
      write = counter_settle(KEYS[i], N, W, now, mark, give, take, expire)
    elseif algorithm == 'sl' then
      write = log_settle(KEYS[i], N, W, now, mark, give, take, expire)
    else
      return redis.error_reply('tollgate: unknown algorithm ' .. tostring(algorithm))
    end
    if write then
      writes[#writes + 1] = write
    end
  end
  for i = 1, #writes do
    writes[i]()
  end
  return 1
end

local peek = op == 'peek'
local reserve = op == 'reserve'
if not (peek or reserve or op == 'acquire') then
  return redis.error_reply('tollgate: unknown request ' .. tostring(op))
end
local cost = amount

local bands = {}
local all = true
for i = 1, #KEYS do
  local at = 3 + 4 * (i - 1)
  local algorithm = ARGV[at + 1]
  local N, W, T = tonumber(ARGV[at + 2]), tonumber(ARGV[at + 3]), tonumber(ARGV[at + 4])
  local band
  if algorithm == 'tb' then
    band = gcra_band(KEYS[i], N, T, now, cost)
  elseif algorithm == 'sc' then
    band = counter_band(KEYS[i], N, W, now, cost)
  elseif algorithm == 'sl' then
    band = log_band(KEYS[i], N, W, now, cost)
  else
    return redis.error_reply('tollgate: unknown algorithm ' .. tostring(algorithm))
  end
  bands[i] = band
  if not band.ok then
    all = false
  end
end

-- The merge (src/composite.rs): the smallest remaining (the first band wins a tie) and its
-- limit, the longest retry_after, the longest reset_after.
local remaining, limit, retry, reset = INF, 0, 0, 0
local function merge(r, l, t, s)
  if r < remaining then
    remaining, limit = r, l
  end
  if t > retry then
    retry = t
  end
  if s > reset then
    reset = s
  end
end

if all then
  for i = 1, #bands do
    local band = bands[i]
    if not peek then
      band.write(expire)
    end
    merge(band.remaining, band.limit, 0, band.reset)
  end
  local reply = { 1, remaining, limit, 0, reset }
  if reserve then
    for i = 1, #bands do
      reply[5 + i] = bands[i].mark
    end
  end
  return reply
end

for i = 1, #bands do
  local band = bands[i]
  if band.ok then
    -- Available now, unspent: what the admission would have left plus what it would take.
    merge(band.remaining + cost, band.limit, 0, band.reset_now)
  else
    merge(band.remaining, band.limit, band.retry, band.reset)
  end
end
local reply = { 0, remaining, limit, retry, reset }
if reserve then
  for i = 1, #bands do
    reply[5 + i] = 0
  end
end
return reply
