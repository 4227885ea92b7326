-- A fragment, not a script: JSON helpers and the encoding of one member row, shared by
-- settle.lua and claim_member.lua (and so by claim.lua and the Redis Streams receive
-- script, which include that). A member row is the array codec.members_to_json writes:
-- [subscriber, pool, state, outcome, attempt, lease_token, lease_owner, lease_until,
-- not_before, reason, updated_at].

local NULL = cjson.null
local function js(x)
  if x == NULL or x == nil then return 'null' end
  return cjson.encode(x)
end
local function num(x)
  return string.format('%.0f', x)
end
local function numornull(x)
  if x == NULL or x == nil then return 'null' end
  return num(x)
end
local function rowjson(r)
  return '[' .. js(r[1]) .. ',' .. js(r[2]) .. ',' .. js(r[3]) .. ',' .. js(r[4]) .. ',' ..
    num(r[5]) .. ',' .. js(r[6]) .. ',' .. js(r[7]) .. ',' .. numornull(r[8]) .. ',' ..
    numornull(r[9]) .. ',' .. js(r[10]) .. ',' .. num(r[11]) .. ']'
end
