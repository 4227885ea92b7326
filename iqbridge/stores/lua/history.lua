-- Every journal entry of one message, in order.
--
-- KEYS[1]  the message's record
-- KEYS[2]  the journal stream
-- KEYS[3]  what a purge kept of the record: the list of its entries ("h:<id>")
--
-- Returns nil for an unknown message, else {{n, fields}, ...}: the stream entries
-- "<n>-0" the record lists, each with its flat field list (m, q, e).

local h = redis.call('HGET', KEYS[1], 'h')
if not h then
  h = redis.call('GET', KEYS[3])
end
if not h then
  return false
end
local out = {}
for n in string.gmatch(h, '[^,]+') do
  local e = redis.call('XRANGE', KEYS[2], n .. '-0', n .. '-0')
  if e[1] then
    out[#out + 1] = {n, e[1][2]}
  end
end
return out
