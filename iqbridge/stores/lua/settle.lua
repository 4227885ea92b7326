-- Settle a batch of one subscriber's held messages (done, or in process) where they live,
-- with a plan the client looked up in the transition table once for the whole batch
-- (iqbridge.engine_batch.SettlePlan): per message the member's state and lease token are
-- compared and set here, the publisher moves once every member is journalled, and the
-- broker entries of what moved are acknowledged, all in one call. The client sends no
-- record: each message is its msg_id, its token, its consumer group and its entry id.
-- A message off the common path (its member in a state the plan does not move, held
-- under another token, a time limit or a browse lock on it, another queue's) is left as
-- it is and reported, for the client's per-message engine to decide (and raise the right
-- error).
--
-- KEYS[1]  the stream whose entries are acknowledged
-- ARGV[1]  the key prefix, "{iq:<prefix>}:"
-- ARGV[2]  this call's write id (the reply is kept under "done:<write id>" for a client
--          that lost it)
-- ARGV[3]  seconds to keep the reply
-- ARGV[4]  the queue
-- ARGV[5]  the subscriber
-- ARGV[6]  the settle's time (µs)
-- ARGV[7]  the number of moves; then each: the member's state before, after, the state
--          it is journalled to next ("" for none), and the moves' journal steps (JSON
--          arrays, comma-separated)
-- then     the number of publisher moves; then each: the publisher state before, after,
--          and the step after its actor (JSON values, comma-separated, with the closing
--          bracket)
-- then     the member states that hold a lease (in doubt), the journalled state
-- then     the number of messages; then each: msg_id, token, consumer group, entry id
--          ("" for none)
--
-- Returns {"ok", flags}: "1" for a message settled, "0" for one left to the client,
-- comma-separated in the order sent.

local P, wid, ttl, q, sub = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local at = tonumber(ARGV[6])
local PER_ROW = 65535

{member_row}

local a = 7
local moves = {}
for _ = 1, tonumber(ARGV[a]) do
  local last = ARGV[a + 3]
  moves[ARGV[a + 1]] = {dst = ARGV[a + 2], last = last ~= '' and last or nil, steps = ARGV[a + 4]}
  a = a + 4
end
a = a + 1
local pubs = {}
for _ = 1, tonumber(ARGV[a]) do
  pubs[ARGV[a + 1]] = {dst = ARGV[a + 2], step = ARGV[a + 3]}
  a = a + 3
end
a = a + 1
local doubt = {[ARGV[a]] = true, [ARGV[a + 1]] = true, [ARGV[a + 2]] = true}
local journalled = ARGV[a + 3]
a = a + 4
local n = tonumber(ARGV[a])
a = a + 1

local dkey = P .. 'd:' .. q
local jn = false
local size = 0
local groups, order = {}, {}

-- Write the journal row numbered jn with the groups gathered so far.
local function flush()
  if #order == 0 then return end
  local parts = {}
  for _, g in ipairs(order) do
    parts[#parts + 1] = g.head .. ',[' .. table.concat(g.items, ',') .. ']]'
  end
  redis.call('XADD', P .. 'journal', jn .. '-0', 'm', '', 'q', q,
    'e', '{"b":[' .. table.concat(parts, ',') .. ']}')
  groups, order = {}, {}
end
local flags = {}
local acks, ackorder = {}, {}

for i = 1, n do
  local id, token, group, ref = ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3]
  a = a + 4
  local ok = false
  local key = P .. 'm:' .. id
  local f = redis.call('HMGET', key, 'v', 's', 'r', 'u', 'mo', 'x', 'lk', 'ix', 'h', 'q')
  if f[1] and not f[6] and not f[7] and f[10] == q then
    local r = cjson.decode(f[3])
    local ps = r[14]
    local members, mine = {}, nil
    for _, m in ipairs(r[20]) do
      members[m[1]] = m
    end
    if f[5] and f[5] ~= '' then
      local over = redis.call('HGETALL', P .. 'ms:' .. id)
      for k = 1, #over, 2 do
        if over[k] == '' then
          ps = over[k + 1]
        else
          members[over[k]] = cjson.decode(over[k + 1])
        end
      end
    end
    mine = members[sub]
    local mv = mine and moves[mine[3]]
    if mv and mine[6] == token then
      ok = true
      local updated = f[4] and tonumber(f[4]) or r[16]
      local stamp = num(at >= updated and at or updated)
      local src = mine[3]
      mine[3] = mv.dst
      if mv.dst == 'DONE' then
        mine[8] = NULL
        if mv.last then
          mine[3] = mv.last
          mine[4] = mv.dst
        end
      end
      mine[11] = tonumber(stamp)
      -- The publisher moves once every member is journalled.
      local pub = nil
      if mv.last == journalled and pubs[ps] then
        pub = pubs[ps]
        for _, m in pairs(members) do
          if m[3] ~= journalled then
            pub = nil
            break
          end
        end
      end
      -- When time next makes something due: the earliest lease still held (a message
      -- with a time limit or a browse lock does not come this way).
      local due = nil
      for _, m in pairs(members) do
        if doubt[m[3]] and m[8] ~= NULL and (due == nil or m[8] < due) then
          due = m[8]
        end
      end
      local ix = cjson.decode(f[8])
      local keep, had = {}, false
      local pold = P .. 'p:' .. q .. '/' .. tostring(ps)
      for _, k in ipairs(ix) do
        if k == dkey then
          had = true
        elseif not (pub and k == pold) then
          keep[#keep + 1] = k
        end
      end
      if pub then
        local pnew = P .. 'p:' .. q .. '/' .. pub.dst
        redis.call('ZREM', pold, id)
        redis.call('ZADD', pnew, f[2], id)
        keep[#keep + 1] = pnew
      end
      if due then
        keep[#keep + 1] = dkey
        redis.call('ZADD', dkey, num(due), id)
      elseif had then
        redis.call('ZREM', dkey, id)
      end
      -- The journal: one group per instant, state left and publisher move.
      local per = pub and 3 or 2
      if not mv.last then per = per - 1 end
      if not jn or size + per > PER_ROW then
        flush()
        jn = num(redis.call('INCR', P .. 'jseq'))
        size = 0
      end
      size = size + per
      local gk = stamp .. '\n' .. src .. '\n' .. (pub and (r[3] .. '\n' .. ps) or '')
      local g = groups[gk]
      if not g then
        local steps = mv.steps
        if pub then
          steps = steps .. ',[' .. cjson.encode(r[3]) .. ',' .. pub.step
        end
        g = {head = '[' .. stamp .. ',[' .. steps .. ']', items = {}}
        groups[gk] = g
        order[#order + 1] = g
      end
      g.items[#g.items + 1] = '[' .. cjson.encode(id) .. ',' .. num(mine[5]) .. ']'
      local h = f[9]
      if h and h ~= '' then h = h .. ',' .. jn else h = jn end
      local over = {sub, rowjson(mine)}
      if pub then
        over[3] = ''
        over[4] = pub.dst
      end
      redis.call('HSET', P .. 'ms:' .. id, unpack(over))
      redis.call('HSET', key, 'v', num(tonumber(f[1]) + 1), 'u', stamp, 'mo', '1', 'h', h,
        'ix', cjson.encode(keep), 'w', wid)
      if ref ~= '' then
        local refs = acks[group]
        if not refs then
          refs = {}
          acks[group] = refs
          ackorder[#ackorder + 1] = group
        end
        refs[#refs + 1] = ref
      end
    end
  end
  flags[i] = ok and '1' or '0'
end

flush()
for _, group in ipairs(ackorder) do
  redis.call('XACK', KEYS[1], group, unpack(acks[group]))
end
local reply = {'ok', table.concat(flags, ',')}
if jn then
  redis.call('SET', P .. 'done:' .. wid, table.concat(reply, ' '), 'EX', ttl)
end
return reply
