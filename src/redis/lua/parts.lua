-- tollgate: several keys decided at once, all or nothing (src/redis/all_of.rs): each key (a
-- part) under its own policy and at its own cost. Every band of every part is read and
-- decided before anything is written, and only an admission by every part writes: a refusal
-- changes nothing anywhere; a part in shadow mode that refuses lets the others decide and
-- writes nothing. Preceded by band.lua, tokens.lua and record.lua; decide.lua calls it.
--
-- KEYS         every part's band keys, part after part, each part's in its band order, then
--              for a part with per-key policies its record (record.lua), and for a part
--              'parts-reserve' reserves its hash of reservation tokens. A band key may appear once only (the Rust side checks): one named
--              twice would be read twice before either write, and spent once.
-- ARGV[1]      as for decide.lua (now, or '' for Redis TIME).
-- ARGV[2]      'parts' (decide, and spend when every part admits), 'parts-peek' (decide,
--              write nothing) or 'parts-reserve' (as 'parts', each part a reservation).
-- ARGV[3]      P, the number of parts; then for each part its cost c >= 1, its number of
--              bands b, '1' if it is in shadow mode ('0' otherwise: a refusal of a part in
--              shadow mode does not refuse the whole, and that part writes nothing), for a
--              part with per-key policies when its policy was chosen (as record.lua's
--              chosen_at takes it) and its text ('0' and '' for none), each band's four
--              arguments as decide.lua takes them, and for
--              'parts-reserve' the reservation's serial and the instance, as decide.lua's
--              'reserve' takes them (the token's field is '<instance>:<serial>'); an empty
--              serial: the part is only spent, not reserved (no token, no token key).
--
-- Reply: { allowed (0 or 1), then for each part its own decision of its cost: allowed,
-- remaining, limit, retry_after (us), reset_after (us) (decide.lua's first five), and for
-- 'parts-reserve' one mark per band (0 unless the whole and the part admit) }. A part that
-- admits reports what it would leave, whether or not the whole admits. When a part's record
-- names another policy than its text, nothing is decided: { 'tier', the part's number,
-- 'move' or 'follow', the record's text, when it was chosen } (see record.lua).

local function decide_parts(now, expire, op)
  local peek, reserve = op == 'parts-peek', op == 'parts-reserve'
  local count = tonumber(ARGV[3])
  if not count or count < 1 then
    return redis.error_reply('tollgate: number of parts out of range: ' .. tostring(ARGV[3]))
  end
  local at, key = 4, 1
  local parts = {}
  local all = true
  for p = 1, count do
    local cost, nb, shadow = tonumber(ARGV[at]), tonumber(ARGV[at + 1]), ARGV[at + 2]
    local chosen, text = chosen_at(ARGV[at + 3], now), ARGV[at + 4]
    if not cost or cost < 1 or not nb or nb < 1 or (shadow ~= '0' and shadow ~= '1')
        or not chosen or not text then
      return redis.error_reply('tollgate: part ' .. p .. ' has no cost, no band or no flags')
    end
    at = at + 5
    local bands, ok, longest = {}, true, 0
    for i = 1, nb do
      local algorithm, W = ARGV[at], tonumber(ARGV[at + 2])
      local band = band_decide(KEYS[key], algorithm, tonumber(ARGV[at + 1]), W,
        tonumber(ARGV[at + 3]), now, cost)
      if not band then
        return redis.error_reply('tollgate: unknown algorithm ' .. tostring(algorithm))
      end
      if W > longest then
        longest = W
      end
      bands[i] = band
      ok = ok and band.ok
      at = at + 4
      key = key + 1
    end
    local part = { bands = bands, ok = ok, cost = cost, longest = longest }
    if text ~= '' then
      local conflict = record_conflict(KEYS[key], text, chosen, p)
      if conflict then
        return conflict
      end
      part.record, part.text, part.chosen = KEYS[key], text, chosen
      key = key + 1
    end
    if reserve then
      local serial, instance = ARGV[at], ARGV[at + 1]
      at = at + 2
      if serial ~= '' then
        part.token, part.serial, part.instance = KEYS[key], serial, instance
        part.life = reservation_life(longest)
        key = key + 1
      end
    end
    parts[p] = part
    all = all and (ok or shadow == '1')
  end
  if key ~= #KEYS + 1 or at ~= #ARGV + 1 then
    return redis.error_reply('tollgate: the parts name ' .. (key - 1) .. ' keys and '
      .. (at - 1) .. ' arguments, the call ' .. #KEYS .. ' and ' .. #ARGV)
  end
  -- Every token the call writes, checked before any part is written: a wrong type there
  -- fails the call whole, spending nothing on any part.
  if all and reserve then
    for p = 1, count do
      if parts[p].ok and parts[p].token then
        local wrong = token_type_error(parts[p].token)
        if wrong then
          return wrong
        end
      end
    end
  end
  local reply = { all and 1 or 0 }
  for p = 1, count do
    local part = parts[p]
    local spend = all and part.ok
    if spend and not peek then
      for i = 1, #part.bands do
        part.bands[i].write(expire)
      end
      if part.record then
        write_record(part.record, part.text, part.chosen, part.longest, expire)
      end
    end
    local verdict = band_verdict(part.bands, part.ok, part.cost)
    for j = 1, 5 do
      reply[#reply + 1] = verdict[j]
    end
    if reserve then
      for i = 1, #part.bands do
        reply[#reply + 1] = spend and part.bands[i].mark or 0
      end
      if spend and part.token then
        write_token(part.token, part.instance .. ':' .. part.serial, part.serial, part.life,
          now, expire)
      end
    end
  end
  return reply
end
