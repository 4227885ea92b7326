-- A fragment, not a script: the claim of one message for a subscriber on a batch claim's
-- common path, shared by the Redis Streams receive script (iqbridge.adapters.redis_wire
-- .RECEIVE_SCRIPT, the claim on receive) and claim.lua (the Redis index's claim of a
-- consumer group's entries). The script that includes it defines first: rp (the key
-- prefix), csub, cat, cuntil, cowner, cstate, csteps, ckey, rkey, dkey, available,
-- revealed and next_token(n), the lease token of the n-th claim. It defines the claims'
-- counters (claimed, jn, jgroups, jorder) and, through member_row.lua, NULL, js(), num()
-- and rowjson(), which the script may use after it.
--
-- f is the record hash's fields v, s, n, r, u, mo, x, lk, ix, h (HMGET, in that order);
-- over its "ms:<msg_id>" hash (HGETALL, empty when the record was never moved).

{member_row}
local claimed, jn, jgroups, jorder = 0, false, {}, {}

-- Claim one entry's message for csub if it is on the common path (the member AVAILABLE
-- in no pool, the message REVEALED, neither locked nor with a time limit, past any
-- retry delay): the token, or nil (the client decides it).
local function claim(id, f, over)
  if f[7] or f[8] then return nil end
  local r = cjson.decode(f[4])
  local ps, row = r[14], nil
  for i = 1, #over, 2 do
    if over[i] == csub then
      row = cjson.decode(over[i + 1])
    elseif over[i] == '' then
      ps = over[i + 1]
    end
  end
  if ps ~= revealed then return nil end
  if not row then
    for _, m in ipairs(r[20]) do
      if m[1] == csub then row = m end
    end
  end
  if not row or row[2] ~= NULL or row[3] ~= available then return nil end
  local nb = row[9]
  if nb ~= NULL and cat < nb then return nil end
  local updated = f[5] and tonumber(f[5]) or r[16]
  local stamp = num(cat >= updated and cat or updated)
  claimed = claimed + 1
  local token = next_token(claimed)
  local key = rp .. 'm:' .. id
  if not jn then
    jn = num(redis.call('INCR', rp .. 'jseq'))
  end
  local items = jgroups[stamp]
  if not items then
    items = {}
    jgroups[stamp] = items
    jorder[#jorder + 1] = stamp
  end
  items[#items + 1] = '[' .. cjson.encode(id) .. ',' .. num(row[5]) .. ']'
  local h = f[10]
  if h and h ~= '' then h = h .. ',' .. jn else h = jn end
  local ix = {}
  for _, k in ipairs(cjson.decode(f[9])) do
    if k ~= ckey and k ~= rkey and k ~= dkey then ix[#ix + 1] = k end
  end
  local due = redis.call('ZSCORE', dkey, id)
  if due then ix[#ix + 1] = dkey end
  if cuntil ~= '' then
    if not due then ix[#ix + 1] = dkey end
    if not due or tonumber(cuntil) < tonumber(due) then
      redis.call('ZADD', dkey, cuntil, id)
    end
  end
  redis.call('HSET', key, 'v', num(tonumber(f[1]) + 1), 'u', stamp, 'mo', '1', 'h', h,
    'ix', cjson.encode(ix))
  row[3], row[6], row[7] = cstate, token, cowner
  row[8], row[9], row[11] = cuntil ~= '' and cuntil or NULL, NULL, stamp
  redis.call('HSET', rp .. 'ms:' .. id, csub, rowjson(row))
  if nb ~= NULL then
    redis.call('HDEL', key, 'b:' .. csub)
  end
  redis.call('ZREM', ckey, id)
  if row[5] >= 2 then
    redis.call('ZREM', rkey, id)
  end
  return token, row[5], r[13]
end

-- Write the claims' journal: one row (jn) listing every claim, one group per instant.
local function write_claims_journal(queue)
  if not jn then return end
  local groups = {}
  for _, stamp in ipairs(jorder) do
    groups[#groups + 1] = '[' .. stamp .. ',' .. csteps .. ',[' ..
      table.concat(jgroups[stamp], ',') .. ']]'
  end
  redis.call('XADD', rp .. 'journal', jn .. '-0', 'm', '', 'q', queue,
    'e', '{"b":[' .. table.concat(groups, ',') .. ']}')
end
