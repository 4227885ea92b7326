-- One page of records from an index kept in put order (score = seq): what a search
-- filters, read in one round trip.
--
-- KEYS[1]  the index (ZSET scored by seq)
-- ARGV     key prefix, seq to start after, page size
--
-- Returns {{msg_id, version, seq, native_ref or false, record JSON}, ...}.

local P = ARGV[1]
local ids = redis.call('ZRANGE', KEYS[1], '(' .. ARGV[2], '+inf', 'BYSCORE', 'LIMIT', 0, ARGV[3])
local out = {}
for _, id in ipairs(ids) do
  local f = redis.call('HMGET', P .. 'm:' .. id, 'v', 's', 'n', 'r')
  if f[1] then
    out[#out + 1] = {id, f[1], f[2], f[3], f[4]}
  end
end
return out
