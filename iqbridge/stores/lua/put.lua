-- Put new messages and their broker entries in one call, all or nothing: the co-located
-- put of Redis Streams with the Redis index, built for a batch. Messages of one kind (one
-- put's options: the same record but for msg_id and size, the same broker entry but for
-- msg_id and payload) share what they have alike, sent once; each message sends its id,
-- kind, journal group, size and payload. Index entries are added one ZADD per index key
-- per batch, the put order takes one INCRBY, and the journal is written per group.
--
-- KEYS[1]  the store's record sequence counter (names the hash tag's node)
-- KEYS[2]  the stream the broker entries go to
-- ARGV[1]  the key prefix, "{iq:<prefix>}:"
-- ARGV[2]  this put's write id (kept on every record; the reply is kept under
--          "done:<write id>" for a client that lost it)
-- ARGV[3]  seconds to keep the reply under "done:<write id>"
-- ARGV[4]  the queue
-- ARGV[5]  the entry's payload field name; ARGV[6] its msg_id field name
-- ARGV[7]  the number of journal groups; then each: its head, the JSON text
--          "[at,[[actor,kind,src,dst,detail],...]" (without the group's closing bracket),
--          and ns (entries per message); every message of a group is on attempt 1
-- then     the number of kinds; then each: the record JSON before its size, the record
--          JSON after its size, p (priority), due (the due time to index it under in
--          "d:<queue>", or ""), ix (JSON list of every index key the record is in, kept
--          for purge), nks then nks index keys to add it to by put order, nkc then nkc
--          index keys to add it to by claim order, nf then nf field/value values of the
--          record hash (optional fields), ne then ne field/value values of the broker
--          entry after its payload and msg_id
-- then     the number of messages; then each: msg_id, kind number, journal group number
--          (0: none), size, payload
--
-- Returns {"ok", seqs, refs}: each message's put-order seq and its entry id, each joined
-- by commas; or {"stale", msg_id} when a msg_id is taken (or repeated), and then nothing
-- was written. The reply is kept under "done:<write id>" as its values joined by spaces,
-- as writes.lua keeps its own.

local P, wid, ttl, q = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local body_field, id_field = ARGV[5], ARGV[6]
local SHIFT = 1099511627776 -- 2^40: claim order is priority first, then put order
local PER_ROW = 65535

local a = 7
local groups = {}
for g = 1, tonumber(ARGV[a]) do
  local per = tonumber(ARGV[a + 2])
  if per < 1 then per = 1 end
  groups[g] = {head = ARGV[a + 1], per = per, who = {}}
  a = a + 2
end
a = a + 1

local kinds = {}
local nkinds = tonumber(ARGV[a])
a = a + 1
for k = 1, nkinds do
  local kd = {pre = ARGV[a], suf = ARGV[a + 1], p = tonumber(ARGV[a + 2]),
              due = ARGV[a + 3], ix = ARGV[a + 4]}
  a = a + 5
  kd.nks, kd.ks0 = tonumber(ARGV[a]), a + 1
  a = a + 1 + kd.nks
  kd.nkc, kd.kc0 = tonumber(ARGV[a]), a + 1
  a = a + 1 + kd.nkc
  kd.nf, kd.f0 = tonumber(ARGV[a]), a + 1
  a = a + 1 + kd.nf
  kd.ne, kd.e0 = tonumber(ARGV[a]), a + 1
  a = a + 1 + kd.ne
  kinds[k] = kd
end

local n = tonumber(ARGV[a])
local m0 = a + 1

-- All or nothing: no msg_id may be taken, nor repeated in the batch.
local seen = {}
for i = 0, n - 1 do
  local id = ARGV[m0 + 5 * i]
  if seen[id] or redis.call('HEXISTS', P .. 'm:' .. id, 'v') == 1 then
    return {'stale', id}
  end
  seen[id] = true
end

-- The journal, group by group, message by message, in rows of at most PER_ROW entries;
-- hist[i]: the row holding message i's entries.
local hist = {}
for i = 0, n - 1 do
  local g = groups[tonumber(ARGV[m0 + 5 * i + 2])]
  if g then
    local who = g.who
    who[#who + 1] = i
  end
end
local row, size, rown = {}, 0, false
local function flush()
  if #row > 0 then
    redis.call('XADD', P .. 'journal', rown .. '-0', 'm', '', 'q', q,
      'e', '{"b":[' .. table.concat(row, ',') .. ']}')
  end
  row, size, rown = {}, 0, false
end
for _, g in ipairs(groups) do
  local items, per = {}, g.per
  for _, i in ipairs(g.who) do
    if size + per > PER_ROW then
      if #items > 0 then
        row[#row + 1] = g.head .. ',[' .. table.concat(items, ',') .. ']]'
        items = {}
      end
      flush()
    end
    if not rown then
      rown = string.format('%.0f', redis.call('INCR', P .. 'jseq'))
    end
    local id = ARGV[m0 + 5 * i]
    if string.find(id, '["\\]') or string.find(id, '%c') then
      id = cjson.encode(id)
    else
      id = '"' .. id .. '"'
    end
    items[#items + 1] = '[' .. id .. ',1]'
    size = size + per
    hist[i] = rown
  end
  if #items > 0 then
    row[#row + 1] = g.head .. ',[' .. table.concat(items, ',') .. ']]'
  end
end
flush()

-- The records and entries; index entries gathered per key, added after.
local base = redis.call('INCRBY', KEYS[1], n) - n
local zorder, zs = {}, {}
local function zadd(key, score, id)
  local t = zs[key]
  if not t then
    t = {}
    zs[key] = t
    zorder[#zorder + 1] = key
  end
  t[#t + 1] = score
  t[#t + 1] = id
end
local due_key = P .. 'd:' .. q
local seqs, refs = {}, {}
for i = 0, n - 1 do
  local b = m0 + 5 * i
  local id, kd = ARGV[b], kinds[tonumber(ARGV[b + 1])]
  local seq = base + i + 1
  local s = string.format('%.0f', seq)
  local ref = redis.call('XADD', KEYS[2], '*', body_field, ARGV[b + 4], id_field, id,
    unpack(ARGV, kd.e0, kd.e0 + kd.ne - 1))
  for k = kd.ks0, kd.ks0 + kd.nks - 1 do
    zadd(ARGV[k], s, id)
  end
  if kd.nkc > 0 then
    local score = string.format('%.0f', seq - kd.p * SHIFT)
    for k = kd.kc0, kd.kc0 + kd.nkc - 1 do
      zadd(ARGV[k], score, id)
    end
  end
  if kd.due ~= '' then
    zadd(due_key, kd.due, id)
  end
  redis.call('HSET', P .. 'm:' .. id, 'v', '1', 's', s, 'q', q,
    'r', kd.pre .. ARGV[b + 3] .. kd.suf, 'h', hist[i] or '', 'w', wid, 'ix', kd.ix,
    'n', ref, unpack(ARGV, kd.f0, kd.f0 + kd.nf - 1))
  seqs[i + 1] = s
  refs[i + 1] = ref
end
for _, key in ipairs(zorder) do
  local t = zs[key]
  for c = 1, #t, 1000 do
    redis.call('ZADD', key, unpack(t, c, math.min(c + 999, #t)))
  end
end

local reply = {'ok', table.concat(seqs, ','), table.concat(refs, ',')}
if n > 0 then
  redis.call('SADD', P .. 'queues', q)
  -- A client that lost this reply reads it here instead of putting again.
  redis.call('SET', P .. 'done:' .. wid, table.concat(reply, ' '), 'EX', ttl)
end
return reply
