-- sluice redislimit: one decision on one key, atomically.
--
-- KEYS[1]  the key's state: a string, format version 1, or 2 with the rate
--          it was last charged under, or 3 and 4, those with a reset's
--          mark (see the state below).
-- ARGV[1]  algorithm (limiter.Algorithm), ARGV[2] hits, ARGV[3] limit,
-- ARGV[4]  period in microseconds (0 with a calendar), ARGV[5] capacity
--          (the effective burst), ARGV[6] behavior bits,
-- ARGV[7]  now in Unix microseconds, or "" for the server's TIME,
-- ARGV[8]  the least TTL in milliseconds: 0, but for tests that pass now,
--          whose keys must outlive the real time a trace takes,
-- ARGV[9]  "1" to keep the strictest rate (limiter.StoreConfig.KeepStrictest),
--          "0" not to,
-- ARGV[10] the calendar unit (limiter.Calendar, 0 for none),
-- ARGV[11] the calendar's zone, a number naming it (0 without a calendar),
-- ARGV[12], ARGV[13] a refund's charged window (limiter.Request.Charged):
--          its start and end in Unix microseconds, 0 and 0 for none; equal
--          for the instant a bucket, GCRA or log charged at,
-- ARGV[14..17] with a calendar: b0 < b1 < b2 < b3, the bounds of three
--          consecutive calendar windows around the caller's clock ('' four
--          times without one, when ARGV[18..23] follow),
-- ARGV[18..23] when the script asked for them: a calendar unit and zone,
--          and the bounds of three windows of it around the server's time
--          (or '' for a zone the caller does not know); '' six times when
--          ARGV[24..27] follow,
-- ARGV[24..27] with a calendar and a refund's charged window: the bounds
--          of three consecutive windows of the calendar around its start.
--
-- Returns {allowed, remaining, resetAt, retryAfter, delay, now, limit,
-- windowStart, windowEnd}, times in microseconds, limit the Limit that
-- decided, the window limiter.Decision.Window names (0 and 0 for none;
-- the instant twice for a bucket, GCRA or log);
-- {-1, now} when no calendar window given holds now; {-2, now, unit, zone}
-- when the script needs the windows of the calendar (unit, zone) a state
-- was charged under around now (ARGV[18..23]).
--
-- The order of limiter's decide: a state that is expired, or reset,
-- starts fresh; a live state has its times bounded by now as its own
-- algorithm reads them (boundTimes), then, of another algorithm, is
-- converted (convert); a refund gives hits back; the algorithm decides. A
-- request that only reads (0 hits, no Reset) is decided the same way and
-- writes nothing.
--
-- Numbers are doubles: every count stays an integer below 2^53, and
-- products that could pass it go through muldiv; every time stays an
-- integer no later than HORIZON, an even one past 2^53 (2255-06-05), where
-- a sum or a window's start may round by a microsecond.

if redis.replicate_commands then redis.replicate_commands() end

-- Every time saturates at HORIZON, limiter's horizon (2262-04-11T23:47:16.854775807Z)
-- rounded down to an even microsecond: from EXACT (2^53 us, 2255-06-05) on,
-- a double holds even integers only, so times there are whole to 2 us.
local HORIZON = 9223372036854774
local EXACT = 9007199254740992 -- 2^53: integers below it are exact
-- A fixed window's last charge is rounded up to a multiple of CHARGE_GRAIN
-- microseconds (2^20, about a second), limiter's lastChargeGrain.
local CHARGE_GRAIN = 1048576
local EPS = 1e-9                 -- the buckets' tolerance, as limiter's
local MAXLOG = 4096              -- limiter.MaxLogEntries
local MAXLIMIT = 1e12            -- limiter.MaxLimit
-- GCRA's tatLead (the third word) bounds the TAT when below this: limiter
-- keeps it in 56 bits of nanoseconds, and a larger lead bounds nothing.
local MAXLEAD = 72057594037928
local VERSION = 1
local VERSION_RATE = 2 -- the state followed by the rate it was charged under
-- Versions 3 and 4 are 1 and 2 followed by a reset's mark (below).
local MARKED = 2
local MAXDRAIN = 100 * 366 * 24 * 3600 * 1000000 -- limiter.MaxDrain, in us

local TOKEN, LEAKY, FIXED, SLOG, SCOUNTER, GCRA = 1, 2, 3, 4, 5, 6
local RESET, DRAIN, REFUND = 1, 2, 4

local key = KEYS[1]
local algo = tonumber(ARGV[1])
local hits = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local period = tonumber(ARGV[4])
local capacity = tonumber(ARGV[5])
local behavior = tonumber(ARGV[6])
local now
if ARGV[7] ~= '' then
  now = tonumber(ARGV[7])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local minTTL = tonumber(ARGV[8])
local keepStrictest = ARGV[9] == '1'
local calendar = tonumber(ARGV[10])
local zone = tonumber(ARGV[11])
local chargedStart, chargedEnd = tonumber(ARGV[12]), tonumber(ARGV[13])
local bounds = nil
if ARGV[14] and ARGV[14] ~= '' then
  bounds = {tonumber(ARGV[14]), tonumber(ARGV[15]), tonumber(ARGV[16]), tonumber(ARGV[17])}
end
-- ARGV[18..23], when the script asked for them (below): the calendar unit
-- and zone of the rate a state was charged under, and the bounds of three
-- consecutive windows of it around the server's time, or '' for a zone
-- the caller does not know.
local stateCal = nil
if ARGV[18] and ARGV[18] ~= '' then
  stateCal = {unit = tonumber(ARGV[18]), zone = tonumber(ARGV[19])}
  if ARGV[20] ~= '' then
    stateCal.bounds = {tonumber(ARGV[20]), tonumber(ARGV[21]), tonumber(ARGV[22]), tonumber(ARGV[23])}
  end
end
-- ARGV[24..27] with a calendar and a refund's charged window: the bounds
-- of three consecutive windows of the request's calendar around the
-- charged window's start, which may lie outside ARGV[14..17].
local chargedBounds = nil
if ARGV[24] then
  chargedBounds = {tonumber(ARGV[24]), tonumber(ARGV[25]), tonumber(ARGV[26]), tonumber(ARGV[27])}
end
local requestCalendar, requestZone = calendar, zone
-- The window the decision counted hits in, or gave them back to.
local windowStart, windowEnd = 0, 0

local function has(bit) return math.floor(behavior / bit) % 2 == 1 end

-- reads: a peek that does not reset, which limiter decides on a copy of
-- the state and never keeps.
local reads = hits == 0 and not has(RESET)

-- floordiv is floor(a/b) for b > 0, exact for |a| < 2^53.
local function floordiv(a, b)
  local q = math.floor(a / b)
  local r = a - q * b
  if r < 0 then q = q - 1 elseif r >= b then q = q + 1 end
  return q
end

local function addsat(t, d)
  if t + d >= HORIZON then return HORIZON end
  return t + d
end

-- muldiv is floor(a*b/c) (ceil when up), exact for integers 0 <= a, b <
-- 2^53 and 0 < c with b + c < 2^52, saturated at cap: the product is
-- taken a bit of a at a time, as long division does.
local function muldiv(a, b, c, up, cap)
  local p = a * b
  if p < EXACT then
    local q = floordiv(p, c)
    if up and q * c < p then q = q + 1 end
    return math.min(q, cap)
  end
  local bitsOf = {}
  while a > 0 do
    local bit = a % 2
    bitsOf[#bitsOf + 1] = bit
    a = (a - bit) / 2
  end
  local q, r = 0, 0 -- q*c + r = (a's bits so far) * b
  for i = #bitsOf, 1, -1 do
    q, r = 2 * q, 2 * r
    if r >= c then q, r = q + 1, r - c end
    if bitsOf[i] == 1 then
      r = r + b
      local k = floordiv(r, c)
      q, r = q + k, r - k * c
    end
    if q >= cap then return cap end
  end
  if up and r > 0 then q = q + 1 end
  return math.min(q, cap)
end

-- The state: its algorithm, expiry and three words, as limiter's (GCRA's
-- third is tatLead, how far ahead of its writer's now the TAT was; 0
-- bounds nothing; a fixed window's is the instant of its last charge
-- that raised the count, 0 unknown). The sliding window log's words are its quantum, its entry count and its
-- base, and its entries follow them: logN entries of 16 bytes in logBody,
-- oldest first, each (at, cum), where cum counts the entry's hits and
-- those of every entry before it since the one whose cum is logBase, so
-- that the total, expiry and the oldest hits reaching a count are binary
-- searches, not a pass over the log.
--
-- Format version 2 follows the three words with the rate the state was
-- last charged under, as limiter's store keeps it under KeepStrictest:
-- its Limit, capacity, Period in microseconds (or minus the calendar
-- unit) and calendar zone; 32 bytes more.
local st = {algo = 0, exp = 0, w = {0, 0, 0}}
local logBody, logN, logBase, quantum = '', 0, 0, 0
local RECORD = 16
local charged = nil -- {limit, capacity, period, zone}, version 2's rate

-- A reset's mark, limiter's resetMark: {at, until}, the instant of a
-- reset of a live state and when that state would have gone fresh (its
-- expiry). Until then a refund naming a charge at an instant, or in a
-- window begun, no later than the reset gives nothing back: the reset
-- cleared its hits. Versions 3 and 4 carry it, 16 bytes after the state
-- (and the rate), before the log's entries; the key lives until it
-- lapses, even with a fresh state.
local mark = nil
-- A drop mark, limiter's: the instant of a write that found the key's
-- state gone fresh and its reset's mark lapsed and left it so, stored as a
-- mark whose end is its instant; it keeps the key, with a fresh state, and
-- no decision at or after it reads it. A decision before it (the clock has
-- stepped back since) that writes marks the key as a reset at that
-- instant would.
local dropAt = nil

local raw = redis.call('GET', key)
if raw then
  local version, head = string.byte(raw, 1), 34
  local marked = version == VERSION + MARKED or version == VERSION_RATE + MARKED
  if marked then version = version - MARKED end
  if version == VERSION_RATE then head = 66 end
  if marked then head = head + 16 end
  if string.len(raw) < head or (version ~= VERSION and version ~= VERSION_RATE) then
    return redis.error_reply('redislimit: state of ' .. key .. ' is not format version 1, 2, 3 or 4')
  end
  if marked then
    local at, untilT = struct.unpack('<dd', raw, head - 15)
    if at == at and untilT == untilT and at >= -HORIZON and untilT <= HORIZON and at < untilT then
      mark = {at, untilT}
    elseif at == untilT and at > 0 and at <= HORIZON then
      dropAt = at
    end
  end
  local _, a, exp, w0, w1, w2 = struct.unpack('<BBdddd', raw)
  -- Numbers within the horizon (NaN is not equal to itself), an
  -- algorithm, a rate as a request has, and a log of at most MAXLOG
  -- entries exactly as long as its count says: what this script writes.
  local function sane(x) return x == x and x >= -HORIZON and x <= HORIZON end
  local ok = a >= TOKEN and a <= GCRA and sane(exp) and sane(w0) and sane(w1) and sane(w2)
  if ok and version == VERSION_RATE then
    local l, c, p, z = struct.unpack('<dddd', raw, 35)
    ok = l >= 1 and l <= MAXLIMIT and l == math.floor(l) and c >= 1 and c <= MAXLIMIT and c == math.floor(c) and
      sane(p) and p == math.floor(p) and p ~= 0 and sane(z) and
      (p > 0 or (p >= -6 and a == FIXED and (w0 < exp or exp <= now))) -- a calendar: a fixed window's, [start, expiry), or a fresh state a mark keeps
    charged = {l, c, p, z}
  end
  if not ok or
      (a == SLOG and (w1 < 0 or w1 > MAXLOG or w1 ~= math.floor(w1) or string.len(raw) ~= head + RECORD * w1)) then
    return redis.error_reply('redislimit: state of ' .. key .. ' is not format version ' .. version .. ' as this script writes it')
  end
  st.algo, st.exp, st.w = a, exp, {w0, w1, w2}
  if a == FIXED then
    -- A fixed window's third number is its last charge, a multiple of
    -- CHARGE_GRAIN, plus its count modulo CHARGE_GRAIN when it was
    -- written: a count that another writer raised since (the script
    -- before last charges, which keeps the number as it finds it) no
    -- longer matches, and the last charge reads as unknown (0).
    if w2 > 0 and w2 < EXACT and w2 == math.floor(w2) and w2 % CHARGE_GRAIN == w1 % CHARGE_GRAIN then
      st.w[3] = w2 - w2 % CHARGE_GRAIN
    else
      st.w[3] = 0
    end
  end
  if a == SLOG then
    quantum, logN, logBase = w0, w1, w2
    logBody = string.sub(raw, head + 1)
  end
end

-- calendarBounds returns the window of the given bounds holding t.
local function calendarWindow(t)
  for i = 1, 3 do
    if bounds[i] <= t and t < bounds[i + 1] then return bounds[i], bounds[i + 1] end
  end
  return nil, nil
end

local function windowBounds(t)
  if bounds then return calendarWindow(t) end
  local start = floordiv(t, period) * period
  return start, addsat(start, period)
end

if bounds and not calendarWindow(now) then
  return {-1, now}
end

local function hasBurst(a) return a == TOKEN or a == LEAKY or a == GCRA end

-- The rate this request charges under, as limiter's chargedOf: Period in
-- microseconds, or minus the calendar unit.
local function ratePeriod()
  if bounds then return -calendar end
  return period
end

-- strictest narrows the request, on a live state last charged under
-- charged, as limiter's strictest: the state's algorithm, the longer
-- Period (a fixed window's Calendar with it), over it the least Limit
-- either rate allows, rounded down, and the least capacity; the state's
-- own rate when that meet is invalid. A calendar window of another unit
-- or zone than the request's is the state's own window, [start, expiry),
-- which holds now while the state is live (the script knows no zone).
local overCapacity = false
-- keepsCount: the meet moves a fixed window's count to a window that
-- begins after the state's last charge (limiter's use of strictest's
-- moved): a decision that charges nothing leaves the count where it is.
local keepsCount = false
if keepStrictest and charged and st.exp > now and not has(RESET) then
  local a = st.algo
  local oLimit, oCap, oPeriod, oZone = charged[1], charged[2], charged[3], charged[4]
  if not hasBurst(a) then oCap = oLimit end
  local same = a == algo and oLimit == limit and oCap == capacity and oPeriod == ratePeriod() and
    (oPeriod > 0 or oZone == zone)
  if not same then
    -- The old rate's window: the request's when it is the same calendar,
    -- else the state's own while it holds now. A state's window after now
    -- (the clock stepped back) is not now's: the caller, asked with the
    -- calendar's unit and zone, hands the windows around now, as limiter
    -- computes them; a caller that does not know the zone leaves the
    -- state's window, from now to its expiry.
    local oBounds, oLength = nil, 0
    if oPeriod < 0 then
      local function holds(b)
        for i = 1, 3 do
          if b[i] <= now and now < b[i + 1] then return b[i + 1] - b[i] end
        end
        return nil
      end
      if bounds and -oPeriod == calendar and oZone == zone then
        oBounds = bounds
        oLength = holds(bounds)
      elseif st.w[1] <= now then
        oBounds, oLength = {st.w[1], st.w[1], st.exp, st.exp}, st.exp - st.w[1]
      elseif stateCal and stateCal.unit == -oPeriod and stateCal.zone == oZone and
          (not stateCal.bounds or holds(stateCal.bounds)) then
        if stateCal.bounds then
          oBounds, oLength = stateCal.bounds, holds(stateCal.bounds)
        else
          oBounds, oLength = {now, now, st.exp, st.exp}, st.exp - st.w[1]
        end
      else
        return {-2, now, -oPeriod, oZone}
      end
    end
    local function lengthOf(b, p)
      if not b then return p end
      if b ~= bounds then return oLength end
      local s, e = calendarWindow(now)
      return e - s
    end
    local ts = lengthOf(oBounds, oPeriod)
    local tr = lengthOf(bounds, period)
    -- m starts as the old rate.
    local mAlgo, mPeriod, mBounds, mCal, mZone = a, oPeriod, oBounds, 0, oZone
    if oPeriod < 0 then mCal, mPeriod = -oPeriod, 0 end
    local tm = ts
    -- The end of the window of bounds b (or Period p) that holds now.
    local function endAt(b, p)
      if not b then return addsat(floordiv(now, p) * p, p) end
      for i = 1, 3 do
        if b[i] <= now and now < b[i + 1] then return b[i + 1] end
      end
      return b[4]
    end
    local lBounds = nil
    if bounds and a == FIXED then lBounds = bounds end
    -- The buckets, GCRA and the log keep the longer Period; a fixed
    -- window or counter keeps the rate whose window holding now ends
    -- later (on a tie, the longer), as limiter's strictest: its count
    -- moves to that window, so hits stay counted until the end of every
    -- window they were charged under.
    local take = tr > ts
    if a == FIXED or a == SCOUNTER then
      local er, eo = endAt(lBounds, tr), endAt(oBounds, oPeriod)
      take = er > eo or (er == eo and tr > ts)
    end
    if take then
      tm = tr
      mPeriod, mBounds, mCal, mZone = tr, nil, 0, 0
      if lBounds then mPeriod, mBounds, mCal, mZone = 0, bounds, calendar, zone end
    end
    local mLimit = math.min(muldiv(oLimit, tm, ts, false, MAXLIMIT + 1), muldiv(limit, tm, tr, false, MAXLIMIT + 1))
    local mCap = math.min(oCap, capacity)
    if not hasBurst(a) then
      mLimit = math.min(mLimit, mCap)
      mCap = mLimit
    end
    local valid = mLimit >= 1 and mLimit <= MAXLIMIT and (mBounds or mCap / mLimit * mPeriod <= MAXDRAIN)
    -- none: over the later-ending window the meet admits less than one
    -- hit; a charge is denied until the key is fresh (limiter's).
    local none = false
    if not valid then
      none = take and mLimit < 1 and (a == FIXED or a == SCOUNTER)
      mLimit, mCap, mPeriod, mBounds, mCal, mZone = oLimit, oCap, oPeriod, oBounds, 0, oZone
      if oPeriod < 0 then mCal, mPeriod = -oPeriod, 0 end
    end
    algo, limit, capacity, period, bounds, calendar, zone = mAlgo, mLimit, mCap, mPeriod, mBounds, mCal, mZone
    if hits > capacity or (none and hits > 0 and not has(REFUND)) then overCapacity = true end
    if take and valid and a == FIXED and st.w[3] > 0 then
      local ms = windowBounds(now)
      keepsCount = ms ~= nil and st.w[3] < ms
    end
  end
end
local storedExp = st.exp
if overCapacity then
  -- Denied, consuming nothing: a peek at the strictest rate, whose wait
  -- is until the key is fresh and the request's own rate applies.
  hits, behavior, reads = 0, 0, true
end

-- The buckets.
local function drainTime(amount)
  if amount <= 0 then return 0 end
  local t = math.ceil(amount * period / limit)
  if t >= HORIZON then return HORIZON end
  return t
end

-- levelAt is a level stored at last as it stands at t, drained at limit
-- per p.
local function levelAt(level, last, t, p)
  if level > 0 and t > last then
    level = level - (t - last) * limit / p
    if level < EPS then level = 0 end
  end
  return level
end

local function bucketRemaining(level)
  local bound = capacity + EPS
  if level + 1 > bound then return 0 end
  local n = math.floor(bound - level)
  while level + (n + 1) <= bound do n = n + 1 end
  while n > 0 and level + n > bound do n = n - 1 end
  return n
end

local function bucketRetry(level, last, exp, probe)
  local function admits(d) return levelAt(level, last, now + d, period) + probe <= capacity + EPS end
  local lo, hi = 0, exp - now
  local guess = math.min(addsat(last, drainTime(level + probe - capacity - EPS)), exp) - now
  if guess > lo and guess < hi then
    if admits(guess) then
      hi = guess
      if not admits(guess - 1) then return guess end
    else
      lo = guess
    end
  end
  while hi - lo > 1 do
    local mid = lo + math.floor((hi - lo) / 2)
    if admits(mid) then hi = mid else lo = mid end
  end
  return hi
end

-- The sliding window log.
local function entry(i) -- at, cum of entry i, 1 the oldest
  return struct.unpack('<dd', logBody, (i - 1) * RECORD + 1)
end

local function lastCum()
  if logN == 0 then return logBase end
  local _, cum = entry(logN)
  return cum
end

local function logTotal() return lastCum() - logBase end

local function logClear() logBody, logN, logBase, quantum = '', 0, 0, 0 end

-- firstEntry is the least i in [1, logN+1] for which pred(i) holds, pred
-- being false then true along the log.
local function firstEntry(pred)
  local lo, hi = 1, logN + 1
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if pred(mid) then hi = mid else lo = mid + 1 end
  end
  return lo
end

local function logExpire(cutoff)
  local k = firstEntry(function(i) return entry(i) > cutoff end) - 1
  if k == logN then
    logClear()
  elseif k > 0 then
    local _, cum = entry(k)
    logBody, logN, logBase = string.sub(logBody, k * RECORD + 1), logN - k, cum
  end
end

-- unpackLog returns the entries as arrays of times and cums, rebased to 0.
local function unpackLog()
  local at, cum = {}, {}
  for i = 1, logN do
    local a, c = entry(i)
    at[i], cum[i] = a, c - logBase
  end
  return at, cum
end

local function packLog(at, cum)
  local parts = {}
  for i = 1, #at do parts[i] = struct.pack('<dd', at[i], cum[i]) end
  logBody, logN, logBase = table.concat(parts), #at, 0
end

local function joinsLast(t)
  if logN == 0 then return false end
  local last = entry(logN)
  return t <= last or (quantum > 0 and floordiv(t, quantum) == floordiv(last, quantum))
end

-- coarsen merges the entries of each multiple of a quantum into the latest
-- of them, doubling the quantum until at most MAXLOG/2 are left.
local function coarsen()
  local at, cum = unpackLog()
  local span = at[#at] - at[1]
  local q = math.max(2 * quantum, 1)
  while q < math.floor(span / (MAXLOG / 2 - 1)) and q < 2 ^ 51 do q = q * 2 end
  while true do
    local a, c = {at[1]}, {cum[1]}
    for i = 2, #at do
      local n = #a
      if floordiv(at[i], q) == floordiv(a[n], q) then
        a[n], c[n] = at[i], cum[i] -- the later entry's cum counts both
      else
        a[n + 1], c[n + 1] = at[i], cum[i]
      end
    end
    at, cum, quantum = a, c, q
    if #a <= MAXLOG / 2 or q >= 2 ^ 51 then break end
    q = q * 2
  end
  packLog(at, cum)
end

local function logAdd(t, h)
  if not joinsLast(t) and logN >= MAXLOG then coarsen() end
  if lastCum() + h >= 2 ^ 52 then -- keep cums exact
    packLog(unpackLog())
  end
  if joinsLast(t) then
    local at, cum = entry(logN)
    logBody = string.sub(logBody, 1, (logN - 1) * RECORD) .. struct.pack('<dd', math.max(at, t), cum + h)
  else
    logBody = logBody .. struct.pack('<dd', t, lastCum() + h)
    logN = logN + 1
  end
end

-- logRemoveNewest takes up to h hits off the newest entries.
local function logRemoveNewest(h)
  while h > 0 and logN > 0 do
    local at, cum = entry(logN)
    local before = logBase
    if logN > 1 then
      local _, c = entry(logN - 1)
      before = c
    end
    local take = math.min(h, cum - before)
    h = h - take
    logBody = string.sub(logBody, 1, (logN - 1) * RECORD)
    if take == cum - before then
      logN = logN - 1
    else
      logBody = logBody .. struct.pack('<dd', at, cum - take)
    end
  end
  if logN == 0 then logClear() end
end

-- logRemoveAt takes up to h hits off entry i and drops it if none are
-- left.
local function logRemoveAt(i, h)
  local at, cum = unpackLog()
  local before = 0
  if i > 1 then before = cum[i - 1] end
  local take = math.min(h, cum[i] - before)
  for j = i, #cum do cum[j] = cum[j] - take end
  if cum[i] == before then
    table.remove(at, i)
    table.remove(cum, i)
  end
  packLog(at, cum)
  if logN == 0 then logClear() end
end

-- The sliding window counter.
local function counterExpiry(start, cur, prev, p, t)
  if cur > 0 then return addsat(start, 2 * p) end
  if prev > 0 then return addsat(start, p) end
  return t
end

local function counterPeriod(p)
  if st.exp == HORIZON then return p end
  local q = st.exp - st.w[1]
  if st.w[2] > 0 then q = q / 2 end
  return q
end

local function regroup(ws, q, cur, prev, start, p)
  local nc, np = 0, 0
  local ends = {{ws + q, cur}, {ws, prev}}
  for i = 1, 2 do
    if ends[i][1] > start then nc = nc + ends[i][2]
    elseif ends[i][1] > start - p then np = np + ends[i][2] end
  end
  return math.min(nc, 1e12), math.min(np, 1e12)
end

local function weightedWait(room, p, count)
  if count == 0 then return 0 end
  local allowance = muldiv(room, p, count, false, p)
  if allowance >= p then return 0 end
  return p - allowance
end

-- GCRA.
local function gcraInterval() return math.ceil(period / limit) end

local function gcraBehind(t)
  local old = st.w[2]
  if old == 0 or st.w[1] <= now then return 0 end
  local behind = st.w[1] - now
  if old ~= t then behind = muldiv(behind, t, old, true, HORIZON - now) end
  return behind
end

-- gcraNanos is, for a peek (which writes nothing) at an emission
-- interval that is not a whole number of microseconds (Period/Limit:
-- 3 s/7 is 428571.43 us) on a state written at another interval,
-- limiter's interval in nanoseconds (Period/Limit rounded up to one) and
-- the state's outstanding time rescheduled at it, in nanoseconds, rounded
-- up: limiter's gcraBehind, whose times the peek reports rounded up to a
-- microsecond once. Rescheduled at t, that interval rounded up to a
-- microsecond, every hit outstanding would count up to a microsecond
-- more (2 hits of 100 ms at 3 s/7: 857144 us, limiter's 857142.858 us),
-- with no state of limiter's at that interval to tell the caller why. A
-- decision that writes keeps t: its TAT is in whole microseconds, and
-- limiter's state then has the interval. nil otherwise, or past 2^50 ns.
local NANOMAX = 1125899906842624 -- 2^50
local function gcraNanos(t)
  local old = st.w[2]
  if not reads or period % limit == 0 or old == 0 or old == t or st.w[1] <= now then return nil end
  local tns = muldiv(period, 1000, limit, true, EXACT)
  if capacity * tns >= NANOMAX or tns + old >= NANOMAX then return nil end
  local b = muldiv(st.w[1] - now, tns, old, true, NANOMAX)
  if b >= NANOMAX then return nil end
  return tns, b
end

-- periodOf is the request's Period, or with a calendar the length of the
-- window that holds now.
local function periodOf()
  if bounds then
    local s, e = calendarWindow(now)
    return e - s
  end
  return period
end

-- counterCounts is the sliding window counter's counts as a decision at
-- now with Period p reads them: the start of now's window, its count and
-- the previous window's.
local function counterCounts(p)
  local start = floordiv(now, p) * p
  local ws, cur, prev = st.w[1], st.w[2], st.w[3]
  if cur > 0 or prev > 0 then
    local q = counterPeriod(p)
    if q ~= p then
      cur, prev = regroup(ws, q, cur, prev, start, p)
    elseif ws == start then
    elseif ws == start - p then
      prev, cur = cur, 0
    else
      -- Both windows are over (boundTimes has moved a window after
      -- now's to now's).
      cur, prev = 0, 0
    end
  end
  return start, cur, prev
end

-- counterRemaining is limit - cur - prev*(p-elapsed)/p rounded down, at
-- least 0.
local function counterRemaining(lim, p, cur, prev, elapsed)
  return math.max(lim - cur - muldiv(prev, p - elapsed, p, true, MAXLIMIT + 1), 0)
end

-- decideAlgorithm decides h hits of the request's algorithm on st, a
-- state of it, at now, and writes the result into st (and the log):
-- limiter's decideAlgorithm. drain is DrainOverLimit.
local function decideAlgorithm(h, drain)
  windowStart, windowEnd = 0, 0
  local probe = math.max(h, 1)
  drain = drain and h > 0
  local allowed, remaining, retry, delay = 0, 0, 0, 0
  if algo == TOKEN or algo == LEAKY then
    -- boundTimes has bounded the level's time by now.
    local level = levelAt(st.w[1], st.w[2], now, period)
    if level + probe <= capacity + EPS then
      allowed = 1
      if algo == LEAKY then delay = drainTime(level) end
      level = level + h
      if h > 0 then windowStart, windowEnd = now, now end
    elseif drain and level < capacity then
      level = capacity
    end
    remaining = bucketRemaining(level)
    st.w[1], st.w[2] = level, now
    st.exp = math.min(addsat(now, drainTime(level)), HORIZON)
    if allowed == 0 then retry = bucketRetry(level, now, st.exp, probe) end
  elseif algo == FIXED then
    -- The stored count is that of now's window: a window that is over
    -- left the state expired, and boundTimes has moved one after now's
    -- to now's; after a change of Period its hits count in now's.
    local start, stop = windowBounds(now)
    local count = st.w[2]
    if count + probe <= limit then
      allowed = 1
      count = count + h
      if h > 0 then windowStart, windowEnd = start, stop end
    else
      if drain and count < limit then count = limit end
      retry = stop - now
    end
    remaining = math.max(limit - count, 0)
    -- The third word is the instant of the last charge that raised the
    -- count (0 unknown): limiter's lastCharge.
    if count > st.w[2] then
      st.w[3] = 0
      if now > 0 then st.w[3] = math.ceil(now / CHARGE_GRAIN) * CHARGE_GRAIN end
    end
    st.w[1], st.w[2] = start, count
    st.exp = now
    if count > 0 then st.exp = stop end
  elseif algo == SCOUNTER then
    local p = period
    local start, cur, prev = counterCounts(p)
    local elapsed = now - start
    remaining = counterRemaining(limit, p, cur, prev, elapsed)
    if probe <= remaining then
      allowed = 1
      cur = cur + h
      remaining = remaining - h
      if h > 0 then windowStart, windowEnd = start, addsat(start, p) end
    else
      if drain then
        cur = cur + remaining
        remaining = 0
      end
      if cur + probe <= limit then
        retry = weightedWait(limit - cur - probe, p, prev) - elapsed
      else
        retry = p - elapsed + weightedWait(limit - probe, p, cur)
      end
    end
    st.w[1], st.w[2], st.w[3] = start, cur, prev
    st.exp = counterExpiry(start, cur, prev, p, now)
  elseif algo == GCRA then
    local t = gcraInterval()
    local ahead = HORIZON - now
    local behind
    local tns, b = gcraNanos(t)
    if tns then
      -- A peek at a fraction of a microsecond a hit: decided in
      -- nanoseconds at limiter's interval, the ResetAt and RetryAfter
      -- rounded up to a microsecond once (see gcraNanos).
      local tolerance = capacity * tns
      local room = tolerance - tns
      if b <= room then
        allowed = 1
      else
        retry = floordiv(b - room + 999, 1000)
      end
      remaining = math.max(floordiv(tolerance - b, tns), 0)
      behind = math.min(floordiv(b + 999, 1000), ahead)
    else
      behind = gcraBehind(t)
      local tolerance = capacity * t
      local room = tolerance - probe * t
      if behind <= room then
        allowed = 1
        behind = math.min(behind + h * t, ahead)
        if h > 0 then windowStart, windowEnd = now, now end
      else
        if drain and behind < tolerance then behind = math.min(tolerance, ahead) end
        retry = behind - room
      end
      remaining = math.max(math.floor((tolerance - behind) / t), 0)
    end
    -- The third word is tatLead: how far ahead of now this TAT is.
    st.w[1], st.w[2], st.w[3] = now + behind, t, behind
    st.exp = now + behind
  else -- SLOG
    logExpire(now - period)
    local total = logTotal()
    if total + probe <= limit then
      allowed = 1
      if h > 0 then
        logAdd(now, h)
        total = total + h
        -- The entry the hits went into, later than now if the clock
        -- stepped back.
        local at = entry(logN)
        windowStart, windowEnd = at, at
      end
    else
      if drain and total < limit then
        logAdd(now, limit - total)
        total = limit
      end
      -- Wait until enough of the oldest hits expire: probe <= limit, so
      -- 0 < need <= total.
      local need = total + probe - limit
      local i = firstEntry(function(j)
        local _, cum = entry(j)
        return cum - logBase >= need
      end)
      retry = entry(i) + period - now
    end
    remaining = math.max(limit - total, 0)
    st.w = {quantum, logN, logBase}
    st.exp = now
    if logN > 0 then st.exp = addsat(entry(logN), period) end
  end
  return allowed, remaining, retry, delay
end

-- consumed is how many hits st, a live state of another algorithm than
-- the request's, still counts at now, read with the request's Limit and
-- Period (periodOf) where the state keeps no rate: limiter's consumed. A
-- bucket's level drained at the request's rate, rounded up; a fixed
-- window's count; the sliding window counter's estimate over the
-- request's Period, rounded up; the log's hits after now-Period; GCRA's
-- outstanding time at its own interval in hits, rounded up. At most
-- MAXLIMIT.
local function consumed()
  local p = periodOf()
  local c = 0
  if st.algo == TOKEN or st.algo == LEAKY then
    local level = levelAt(st.w[1], st.w[2], now, p) - EPS
    if level > 0 then c = math.min(math.ceil(level), MAXLIMIT) end
  elseif st.algo == FIXED then
    c = st.w[2]
  elseif st.algo == SCOUNTER then
    -- The counter's own rule with room for every hit: what it has left
    -- below MAXLIMIT is what it counts.
    local start, cur, prev = counterCounts(p)
    c = MAXLIMIT - counterRemaining(MAXLIMIT, p, cur, prev, now - start)
  elseif st.algo == GCRA then
    local t = st.w[2]
    if t > 0 and st.w[1] > now then
      local d = st.w[1] - now
      c = floordiv(d, t)
      if c * t < d then c = c + 1 end
    end
  else -- SLOG
    local k = firstEntry(function(i) return entry(i) > now - p end)
    if k == 1 then
      c = logTotal()
    else
      local _, cum = entry(k - 1)
      c = lastCum() - cum
    end
  end
  return math.min(math.max(c, 0), MAXLIMIT)
end

local function startFresh()
  st = {algo = algo, exp = 0, w = {0, 0, 0}}
  logClear()
end

-- convert carries st, a live state of another algorithm, into the
-- request's: the state that algorithm has after taking, from fresh at now,
-- the hits st still counts (consumed), at most its capacity.
local function convert()
  local c = consumed()
  startFresh()
  if c > 0 then decideAlgorithm(math.min(c, capacity), false) end
end

-- logBoundTimes moves the entries after now to now, merged into one.
local function logBoundTimes()
  local i = logN
  while i > 0 and entry(i) > now do i = i - 1 end
  if i == logN then return end
  local last = lastCum()
  logBody, logN = string.sub(logBody, 1, i * RECORD), i
  if joinsLast(now) then
    logBody = string.sub(logBody, 1, (i - 1) * RECORD) .. struct.pack('<dd', now, last)
  else
    logBody = logBody .. struct.pack('<dd', now, last)
    logN = logN + 1
  end
end

-- boundTimes reads a live state of algorithm a, the state's own, whose
-- times lie after now (the clock stepped back) as written at now:
-- limiter's boundTimes.
local function boundTimes(a)
  if a == TOKEN or a == LEAKY then
    if st.w[2] > now then st.w[2] = now end
  elseif a == GCRA then
    local lead = st.w[3]
    if lead < MAXLEAD and st.w[1] > addsat(now, lead) then st.w[1] = now + lead end
  elseif a == FIXED then
    -- A window that began after now, not one that began after now's
    -- began: that is a longer Period's, which counts in now's.
    if st.w[1] > now and st.w[2] > 0 then st.w[1] = windowBounds(now) end
  elseif a == SCOUNTER then
    local p = periodOf()
    local start = floordiv(now, p) * p
    local ws, cur, prev = st.w[1], st.w[2], st.w[3]
    if (cur > 0 or prev > 0) and ws > start and (ws > now or counterPeriod(p) == p) then
      cur = math.max(cur, math.min(cur + prev, limit))
      st.w[1], st.w[2], st.w[3] = start, cur, 0
      st.exp = counterExpiry(start, cur, 0, p, now)
    end
  else
    logBoundTimes()
  end
end

-- refundInstant gives back what is still counted of hits charged at the
-- instant chargedStart, to st, a live state of the request's algorithm as
-- stored, and reports whether it gave any back: limiter's refundInstant
-- (which says why this never takes another request's hits). A bucket or
-- GCRA gets back at most hits - rate*(now - at), floor 0, if its rate is
-- the request's; a sliding window log at most hits of its entry at that
-- instant, while the entry is in the window.
local function refundInstant()
  local at = chargedStart
  if algo == TOKEN or algo == LEAKY then
    local stored, last = st.w[1], st.w[2]
    -- The expiry the last decision wrote tells the rate it drained at.
    if stored <= 0 or st.exp ~= math.min(addsat(last, drainTime(stored)), HORIZON) then return false end
    local level = levelAt(stored, last, now, period)
    local back = hits
    if at < now then back = back - (now - at) * limit / period end
    back = math.min(back, level)
    if back <= 0 then return false end
    level = level - back
    if level < EPS then level = 0 end
    st.w[1], st.w[2] = level, math.max(last, now)
    return true
  elseif algo == GCRA then
    local t, tat, lead = st.w[2], st.w[1], st.w[3]
    -- The TAT as boundTimes reads it: a clock that stepped back leaves it
    -- further ahead than any hits are.
    if lead < MAXLEAD and tat > addsat(now, lead) then tat = now + lead end
    if t == 0 or t ~= gcraInterval() or tat <= now then return false end
    local back = hits * t
    if at < now then
      if now - at >= back then return false end
      back = back - (now - at)
    end
    st.w[1] = tat - math.min(back, tat - now)
    return true
  end
  -- SLOG
  if logN == 0 or st.exp ~= addsat(entry(logN), period) or at <= now - period then return false end
  local i = firstEntry(function(j) return entry(j) >= at end)
  if i > logN or entry(i) ~= at then return false end
  logRemoveAt(i, hits)
  return true
end

-- A reset's mark that has lapsed is none. A write that finds the key's
-- state gone fresh, or its mark (a reset's or a drop mark) lapsed, and
-- leaves it so, leaves a drop mark (limiter's dropMarkAtLocked): a state
-- fresh on a clock ahead may hold charges that a clock set right still
-- counts.
-- A drop mark after now reads as a reset's mark at its instant (limiter's
-- chargedSinceResetLocked and epochLocked read it alike).
if dropAt and dropAt > now then mark = {dropAt, dropAt} end
local discarded = raw and st.exp <= now and (mark == nil or mark[2] <= now)
if mark and mark[2] <= now then mark = nil end

-- timesAfter reports whether boundTimes (below) moves times of the live
-- state that lie after now (the clock stepped back), for every algorithm
-- but the sliding window log, whose entries keep their instants:
-- limiter's timesAfter.
local function timesAfter()
  local a = st.algo
  if a == TOKEN or a == LEAKY then return st.w[2] > now end
  if a == GCRA then return st.w[3] < MAXLEAD and st.w[1] > addsat(now, st.w[3]) end
  if a == FIXED then return st.w[1] > now and st.w[2] > 0 end
  if a == SCOUNTER then
    local p = periodOf()
    local start = floordiv(now, p) * p
    return (st.w[2] > 0 or st.w[3] > 0) and st.w[1] > start and (st.w[1] > now or counterPeriod(p) == p)
  end
  return false
end

-- A state read as written at now holds charges that a refund cannot tell
-- by their instant or window from earlier ones it no longer counts: the
-- decision marks the key as a reset at now does, for as long as a refund
-- of a charge made before now could find hits (limiter's stepMarkUntil).
-- A decision before the key's drop mark, on a state that is not live,
-- marks the key as a reset at the drop would, for as long as a refund of a
-- charge made before it could find hits (limiter's dropMarkUntil): a
-- window algorithm's for 3 of now's periods after it.
local function reach(t)
  if algo == GCRA then return addsat(t, capacity * gcraInterval()) end
  return math.min(addsat(t, math.ceil(capacity * periodOf() / limit)), HORIZON)
end
local step, kept = nil, nil
if st.exp > now and not has(RESET) and timesAfter() then
  -- At now, or an epoch before the reading a bucket's or GCRA's state
  -- was last written at (limiter's stepMarkAt).
  local at = now
  if algo == FIXED or algo == SCOUNTER or algo == SLOG then
  elseif st.algo == TOKEN or st.algo == LEAKY then
    at = math.max(now, st.w[2] - 1)
  elseif st.algo == GCRA and st.w[3] < MAXLEAD then
    at = math.max(now, st.w[1] - st.w[3] - 1)
  end
  local untilT
  if algo == FIXED or algo == SCOUNTER then
    local _, e = windowBounds(now)
    untilT = addsat(e, periodOf())
  else
    untilT = reach(at)
  end
  step = {at, untilT}
  kept = step
elseif st.exp <= now and dropAt and now < dropAt then
  local untilT
  if algo == FIXED or algo == SCOUNTER then
    untilT = addsat(addsat(addsat(dropAt, periodOf()), periodOf()), periodOf())
  else
    untilT = reach(dropAt)
  end
  step = {dropAt, untilT}
  -- The key keeps the drop mark (limiter's decideKeyLocked).
  kept = {dropAt, dropAt}
end

-- mergeMark is the mark m (nil: none) with n, a mark at now, merged: the
-- later instant and the later end.
local function mergeMark(m, n)
  if not m then return n end
  return {math.max(m[1], n[1]), math.max(m[2], n[2])}
end
local refundMark = mark
if step then refundMark = mergeMark(mark, step) end

-- chargedWindow is the window holding t, an instant of a refund's charged
-- window: windowBounds, or for a calendar the windows the caller computed
-- around the charged window when those around now do not hold t.
local function chargedWindow(t)
  local s, e = windowBounds(t)
  if not s and chargedBounds and calendar == requestCalendar and zone == requestZone then
    for i = 1, 3 do
      if chargedBounds[i] <= t and t < chargedBounds[i + 1] then return chargedBounds[i], chargedBounds[i + 1] end
    end
  end
  return s, e
end

-- A window of a fixed window or sliding window counter that holds a
-- reset is two windows to a refund (limiter's chargedSinceResetLocked):
-- the charges before the reset name it, those after name it with start
-- one microsecond after the reset (its epoch since the reset).
-- A charge at the reset's instant, made after it, is named by its
-- instant's epoch alike.
if refundMark and has(REFUND) and not has(RESET) and (chargedStart ~= 0 or chargedEnd ~= 0) then
  local m = refundMark[1]
  local s, e = nil, nil
  if chargedStart == m + 1 and chargedStart == chargedEnd then
    s, e = m, m
    if algo == SLOG and st.algo == SLOG then
      -- A log's charge so named is at the reset's instant or one
      -- microsecond after it: both hold only hits charged after it.
      local i = firstEntry(function(j) return entry(j) >= m end)
      if i > logN or entry(i) ~= m then s, e = chargedStart, chargedEnd end
    end
  elseif chargedStart == m + 1 then
    s, e = chargedWindow(m)
    if e ~= chargedEnd then s = nil end
  elseif chargedEnd == m + 1 and chargedStart < m and (hasBurst(algo) or algo == SLOG) then
    -- A charge made after a reset at an instant before it (the reset
    -- was made with the clock ahead).
    s, e = chargedStart, chargedStart
  elseif chargedEnd == m + 1 and chargedStart < m then
    -- A window that ended by the reset on the clock it was made with.
    local ws, we = chargedWindow(chargedStart)
    if ws == chargedStart and we and we <= m then s, e = ws, we end
  end
  if s then
    chargedStart, chargedEnd = s, e
  elseif chargedStart <= m then
    hits = 0 -- cleared by the reset: gives nothing back
  end
end

local gaveBack = false
-- A refund to the charge it names: to the window of a fixed window or
-- sliding window counter (limiter's refundWindow), the hits go back to the
-- count of the stored state, of the request's algorithm, whose window it
-- is (a fixed window's, or a sliding window counter's current or previous
-- one); to the other algorithms, what of the hits charged at the instant
-- it names is still counted (refundInstant). Both before the state's times
-- are bounded; one that finds nothing gives nothing back and is a peek,
-- which writes nothing.
if has(REFUND) and not has(RESET) and (chargedStart ~= 0 or chargedEnd ~= 0) then
  local which = 0 -- 1 the current window's count, 2 the counter's previous
  if hits > 0 and st.exp > now and st.algo == algo then
    if algo == FIXED then
      if st.w[2] > 0 and st.w[1] == chargedStart and st.exp == chargedEnd then which = 1 end
    elseif algo == SCOUNTER then
      if st.w[2] > 0 or st.w[3] > 0 then
        local q = counterPeriod(period)
        if st.w[2] > 0 and st.w[1] == chargedStart and addsat(st.w[1], q) == chargedEnd then
          which = 1
        elseif st.w[3] > 0 and st.w[1] - q == chargedStart and st.w[1] == chargedEnd then
          which = 2
        end
      end
    elseif chargedStart == chargedEnd and refundInstant() then
      which = 3
    end
  end
  if which == 3 then
    -- refundInstant gave them back.
  elseif which ~= 0 and algo == SCOUNTER then
    local q = counterPeriod(period)
    if which == 1 then st.w[2] = math.max(st.w[2] - hits, 0) else st.w[3] = math.max(st.w[3] - hits, 0) end
    st.exp = counterExpiry(st.w[1], st.w[2], st.w[3], q, st.exp)
  elseif which ~= 0 then
    st.w[2] = math.max(st.w[2] - hits, 0)
  else
    reads = true
  end
  hits, behavior = 0, 0
  if which ~= 0 then gaveBack = true end
end

if has(RESET) and not reads then
  -- The mark lasts until the state it clears, if live, would have gone
  -- fresh, or until the mark already there would have lapsed.
  -- A mark after now (made with the clock ahead) keeps its instant: the
  -- charges it cleared may be named up to it.
  local untilT, at = 0, now
  if mark then untilT, at = mark[2], math.max(mark[1], now) end
  if mark and mark[1] > now then
    -- It clears the charges named by the mark's epoch too, and moves
    -- the instant one epoch later (limiter's markResetLocked).
    at = mark[1] + 1
    untilT = math.max(untilT, at + 1)
  end
  if st.exp > now then untilT = math.max(untilT, st.exp) end
  if untilT > now then mark = {at, untilT} end
end

if st.exp <= now or has(RESET) then
  startFresh()
else
  -- Times after now are bounded as the state's own algorithm reads them,
  -- before a conversion counts what it holds.
  boundTimes(st.algo)
  if st.algo ~= algo then convert() end
end

-- Refund gives hits back, then the request is a peek.
if has(REFUND) then
  local h = hits
  if algo == TOKEN or algo == LEAKY then
    local last = st.w[2]
    local level = levelAt(st.w[1], last, now, period)
    st.w[1], st.w[2] = math.max(level - h, 0), math.max(last, now)
  elseif algo == FIXED then
    local start = windowBounds(now)
    if st.w[1] >= start then st.w[2] = math.max(st.w[2] - h, 0) end
  elseif algo == SCOUNTER then
    if st.w[2] > 0 then
      local q = counterPeriod(period)
      st.w[2] = math.max(st.w[2] - h, 0)
      st.exp = counterExpiry(st.w[1], st.w[2], st.w[3], q, st.exp)
    end
  elseif algo == GCRA then
    local t = st.w[2]
    if t ~= 0 and st.w[1] > now then st.w[1] = math.max(st.w[1] - h * t, now) end
  else
    logRemoveNewest(h)
  end
  hits, behavior = 0, 0
end

local allowed, remaining, retry, delay = decideAlgorithm(hits, has(DRAIN))
if keepsCount and allowed == 0 and hits > 0 and not has(DRAIN) then
  -- Denied, charging nothing: decided as a peek, which writes nothing, so
  -- that two rates whose windows never end together do not hold the
  -- key's hits for ever by denying each other's checks.
  reads = true
end
if gaveBack then
  -- A refund to its window (above) names the window it gave hits back to.
  windowStart, windowEnd = chargedStart, chargedEnd
end

-- A decision that writes and read the state as written at now leaves
-- its mark, and one before the key's drop mark keeps that, each lasting
-- at least as long as the state (limiter's markStepLocked).
if kept and not reads then
  mark = mergeMark(mark, kept)
  mark[2] = math.max(mark[2], st.exp)
end
local drop = discarded and not reads and st.exp <= now and not mark and now > 0

-- A window that holds a reset whose mark lasts is named by its epoch
-- since the reset, and so is a charge at the reset's instant (limiter's
-- epochLocked).
if mark and (windowStart ~= 0 or windowEnd ~= 0) then
  if windowStart == windowEnd and windowStart == mark[1] then
    windowStart, windowEnd = mark[1] + 1, mark[1] + 1
  elseif windowStart == windowEnd and windowStart < mark[1] then
    -- A charge made after a reset at an instant before it (the reset
    -- was made with the clock ahead): the instant, ending at the
    -- reset's epoch.
    windowEnd = mark[1] + 1
  elseif windowStart <= mark[1] and mark[1] + 1 < windowEnd then
    windowStart = mark[1] + 1
  elseif windowEnd <= mark[1] then
    -- A window that ended by the reset, on the clock it was made with.
    windowEnd = mark[1] + 1
  end
end

if overCapacity then
  allowed, retry = 0, math.max(storedExp - now, 1)
end

if reads then
  -- A peek keeps nothing: limiter decides it on a copy.
elseif st.exp > now or mark or drop then
  local value
  local resetAt = st.exp
  -- A drop mark keeps a fresh state, which no clock set back reads as
  -- live (limiter's entry as good as dropped).
  if drop then startFresh() end
  local version = VERSION
  if keepStrictest then version = VERSION_RATE end
  if mark or drop then version = version + MARKED end
  if algo == FIXED then
    -- The last charge bound to the count it was written with (above).
    if st.w[3] > 0 and st.w[3] + CHARGE_GRAIN < EXACT then
      st.w[3] = st.w[3] + st.w[2] % CHARGE_GRAIN
    else
      st.w[3] = 0
    end
  end
  if keepStrictest then
    value = struct.pack('<BBdddddddd', version, algo, st.exp, st.w[1], st.w[2], st.w[3],
      limit, capacity, ratePeriod(), zone)
  else
    value = struct.pack('<BBdddd', version, algo, st.exp, st.w[1], st.w[2], st.w[3])
  end
  local lasts = st.exp
  if mark then
    value = value .. struct.pack('<dd', mark[1], mark[2])
    lasts = math.max(lasts, mark[2])
  elseif drop then
    value = value .. struct.pack('<dd', now, now)
  end
  if algo == SLOG then value = value .. logBody end
  -- The key lives until its state is fresh again, and its mark has
  -- lapsed, to the millisecond; a drop mark a millisecond past its
  -- instant on the server's clock, which a clock set back then finds.
  redis.call('SET', key, value, 'PX', math.max(math.ceil((lasts - now) / 1000), minTTL, 1))
  st.exp = resetAt
elseif raw then
  redis.call('DEL', key)
end

return {allowed, remaining, st.exp, retry, delay, now, limit, windowStart, windowEnd}
