-- Message ids available to one subscriber now, in claim order (priority first, then
-- put order): the claimable / redeliverable query of the Redis index store.
--
-- KEYS[1]  the subscriber's claim index (ZSET, claim order)
-- KEYS[2]  with a lock id: the queue's index of messages locked under it
-- ARGV     key prefix, subscriber, now, limit, lock id ("" for none)
--
-- Leaves out members given back with a delay that runs past now, messages whose time
-- limit passed and, without a lock id, browse-locked messages; with a lock id, returns
-- only messages locked under it (and not lapsed).

local P, sub = ARGV[1], ARGV[2]
local now, limit, lock = tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
local delay_field = 'b:' .. sub

local function claimable(id)
  local f = redis.call('HMGET', P .. 'm:' .. id, 'x', 'lk', 'lu', delay_field, 'v')
  if not f[5] then
    return false -- no record (deleted by hand): nothing to claim
  end
  if f[4] and tonumber(f[4]) > now then
    return false
  end
  if f[1] and tonumber(f[1]) <= now then
    return false
  end
  local locked = f[2] and (not f[3] or tonumber(f[3]) > now)
  if lock == '' then
    return not locked
  end
  return locked and f[2] == lock
end

local out = {}
if limit <= 0 then
  return out
end

if lock ~= '' then
  -- Few messages share one lock: walk the lock index, order by claim score.
  local hits = {}
  for _, id in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
    local score = redis.call('ZSCORE', KEYS[1], id)
    if score and claimable(id) then
      hits[#hits + 1] = {tonumber(score), id}
    end
  end
  table.sort(hits, function(a, b) return a[1] < b[1] end)
  for i = 1, math.min(limit, #hits) do
    out[i] = hits[i][2]
  end
  return out
end

local chunk = math.max(limit, 64)
local start = 0
while #out < limit do
  local ids = redis.call('ZRANGE', KEYS[1], start, start + chunk - 1)
  if #ids == 0 then
    break
  end
  for _, id in ipairs(ids) do
    if claimable(id) then
      out[#out + 1] = id
      if #out >= limit then
        break
      end
    end
  end
  start = start + chunk
end
return out
