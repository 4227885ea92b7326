-- One page of records from an index kept in put order (score = seq): what a search
-- filters, read in one round trip.
--
-- KEYS[1]  the index (ZSET scored by seq)
-- ARGV     key prefix, seq to start after, page size
--
-- Returns {scanned, last seq scanned or false, {{msg_id, version, seq, native_ref or
-- false, record JSON, updated_at, {subscriber, member row, ...} written apart by a
-- claim on receive}, ...}}: a page shorter than asked is the end of the index.

local P = ARGV[1]
local page = redis.call('ZRANGE', KEYS[1], '(' .. ARGV[2], '+inf', 'BYSCORE', 'LIMIT', 0,
  ARGV[3], 'WITHSCORES')
local rows = {}
local last = false
for i = 1, #page, 2 do
  local id = page[i]
  last = page[i + 1]
  local f = redis.call('HMGET', P .. 'm:' .. id, 'v', 's', 'n', 'r', 'u', 'mo')
  if f[1] then
    local over = {}
    if f[6] and f[6] ~= '' then
      over = redis.call('HGETALL', P .. 'ms:' .. id)
    end
    rows[#rows + 1] = {id, f[1], f[2], f[3], f[4], f[5], over}
  end
end
return {#page / 2, last, rows}
