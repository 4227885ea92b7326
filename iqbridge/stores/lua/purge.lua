-- Delete messages whose publisher is JOURNALLED since before a time, in put order,
-- with their index entries and retained payload copies ("b:<id>"). The journal stream
-- is kept, and each message's list of its entries under "h:<id>" (its history).
--
-- KEYS[1]  the queue's index of publisher-JOURNALLED messages (ZSET, put order)
-- ARGV     key prefix, before (microseconds), limit, request id[, msg_id, ...]
--
-- Without ids, walks KEYS[1] from the oldest. With ids (a purge plan's list), considers
-- only those: an id is a candidate if it is in KEYS[1] (ZSCORE: JOURNALLED and of this
-- queue) and its record's "u" is before the time; the oldest "limit" candidates go.
-- Unknown ids, ids of other queues and repeated ids are ignored.
--
-- Returns {{msg_id, native_ref or ""}, ...}. The answer is also kept for a minute
-- under "done:<request id>", so a client that lost the reply can read it instead of
-- purging again.

local P, before, limit, rid = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local out = {}

local function drop(id, f)
  for _, k in ipairs(cjson.decode(f[3] or '[]')) do
    redis.call('ZREM', k, id)
  end
  if f[4] then  -- where its journal entries are: the history stays readable
    redis.call('SET', P .. 'h:' .. id, f[4])
  end
  redis.call('DEL', P .. 'm:' .. id, P .. 'b:' .. id, P .. 'ms:' .. id)
  out[#out + 1] = {id, f[2] or ''}
end

if #ARGV > 4 then
  local found, seen = {}, {}
  for i = 5, #ARGV do
    local id = ARGV[i]
    if not seen[id] then
      seen[id] = true
      local score = redis.call('ZSCORE', KEYS[1], id)
      if score then
        local f = redis.call('HMGET', P .. 'm:' .. id, 'u', 'n', 'ix', 'h')
        if f[1] and tonumber(f[1]) < before then
          found[#found + 1] = {tonumber(score), id, f}
        end
      end
    end
  end
  table.sort(found, function(a, b) return a[1] < b[1] end)
  for i = 1, math.min(#found, limit) do
    drop(found[i][2], found[i][3])
  end
else
  local start, chunk = 0, math.max(limit, 64)
  while #out < limit do
    local ids = redis.call('ZRANGE', KEYS[1], start, start + chunk - 1)
    if #ids == 0 then
      break
    end
    local gone = 0
    for _, id in ipairs(ids) do
      local f = redis.call('HMGET', P .. 'm:' .. id, 'u', 'n', 'ix', 'h')
      if f[1] and tonumber(f[1]) < before then
        drop(id, f)
        gone = gone + 1
        if #out >= limit then
          break
        end
      end
    end
    start = start + chunk - gone
  end
end
redis.call('SET', P .. 'done:' .. rid, cjson.encode(out), 'EX', 60)
return out
