-- tollgate: exact integer arithmetic on Lua numbers.
--
-- Redis runs Lua 5.1, whose numbers are IEEE doubles: integers are exact up to 2^53. Every
-- quantity here is a whole number of microseconds or permits, and the Rust side keeps them
-- in range: windows at most 2^50 us, permits at most the window, clock readings below 2^52.
-- So sums such as `now + 2 * window` stay below 2^53, and the two operations that could
-- leave the exact range, division and `a * b / c`, are done by the helpers below.

-- Stands for "more than any window": longest_left's "every instant will do", and the
-- starting point of the merged remaining. Never formatted or stored.
local INF = 2 ^ 60

-- An integer as Redis expects it in a command argument: all digits, no exponent. (tostring
-- and Redis's own number conversion print 14 significant digits.)
local function fmt(x)
  return string.format('%.0f', x)
end

-- floor(a / b) for integers 0 <= a <= 2^52 and 1 <= b <= 2^52. The double quotient is
-- correctly rounded, so its floor is off by at most one; one multiplication (below 2^53)
-- finds out which way and corrects it.
local function idiv(a, b)
  local q = math.floor(a / b)
  local r = a - q * b
  if r < 0 then
    q = q - 1
  elseif r >= b then
    q = q + 1
  end
  return q
end

-- q, r with a * b = q * c + r and 0 <= r < c, for integers 0 <= a < 2^32,
-- 0 <= b <= 2^51 and 1 <= c <= 2^51; q is INF (and r 0) when q would reach 2^52.
-- The product may be far beyond 2^53, so beyond the fast path it is never formed: b is split
-- as q0 * c + r0, and a * r0 / c is long multiplication over a's bits, whose partial
-- remainders stay below 2c.
local function muldiv(a, b, c)
  local p = a * b
  if p < 2 ^ 52 then
    -- The product is exact (a rounded product below 2^52 means an exact one below it).
    local q = idiv(p, c)
    return q, p - q * c
  end
  local q0 = idiv(b, c)
  local r0 = b - q0 * c
  local hi = a * q0
  if hi >= 2 ^ 52 then
    return INF, 0
  end
  local q, r = 0, 0
  local bit = 2 ^ 31
  while bit >= 1 do
    q = q * 2
    r = r * 2
    if r >= c then
      r = r - c
      q = q + 1
    end
    if a >= bit then
      a = a - bit
      r = r + r0
      if r >= c then
        r = r - c
        q = q + 1
      end
    end
    bit = bit / 2
  end
  q = hi + q
  if q >= 2 ^ 52 then
    return INF, 0
  end
  return q, r
end
