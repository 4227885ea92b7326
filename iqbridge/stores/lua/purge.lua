-- Delete messages whose publisher is JOURNALLED since before a time, in put order,
-- with their index entries and retained payload copies ("b:<id>"). The journal stream
-- is kept.
--
-- KEYS[1]  the queue's index of publisher-JOURNALLED messages (ZSET, put order)
-- ARGV     key prefix, before (microseconds), limit, request id
--
-- Returns {{msg_id, native_ref or ""}, ...}. The answer is also kept for a minute
-- under "done:<request id>", so a client that lost the reply can read it instead of
-- purging again.

local P, before, limit, rid = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local out = {}
local start, chunk = 0, math.max(limit, 64)
while #out < limit do
  local ids = redis.call('ZRANGE', KEYS[1], start, start + chunk - 1)
  if #ids == 0 then
    break
  end
  local gone = 0
  for _, id in ipairs(ids) do
    local key = P .. 'm:' .. id
    local f = redis.call('HMGET', key, 'u', 'n', 'ix')
    if f[1] and tonumber(f[1]) < before then
      for _, k in ipairs(cjson.decode(f[3] or '[]')) do
        redis.call('ZREM', k, id)
      end
      redis.call('DEL', key, P .. 'b:' .. id)
      out[#out + 1] = {id, f[2] or ''}
      gone = gone + 1
      if #out >= limit then
        break
      end
    end
  end
  start = start + chunk - gone
end
redis.call('SET', P .. 'done:' .. rid, cjson.encode(out), 'EX', 60)
return out
