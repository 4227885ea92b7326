-- Claim the messages of broker entries one subscriber's own consumer group delivered,
-- where the Redis index keeps them, with a plan the client looked up in the transition
-- table once for the batch (iqbridge.engine_batch.ClaimPlan): per message the member is
-- compared and set here, as the Redis Streams receive script claims on receive
-- (claim_member.lua, spliced in below), and the batch's journal is one row. The client
-- sends no record: each entry is its msg_id, broker reference and ordering key.
--
-- An entry off the common path (no record, another queue's, a second entry of one
-- message, a broker reference the index does not know it by, the member not AVAILABLE
-- or in a pool, the message not REVEALED, a time limit, a browse lock, a retry delay
-- running), and every later entry of the same ordering key, is left as it is and
-- reported, for the client to decide in order.
--
-- ARGV[1]  the key prefix, "{iq:<prefix>}:"
-- ARGV[2]  this call's write id (the reply is kept under "done:<write id>" for a client
--          that lost it)
-- ARGV[3]  seconds to keep the reply
-- ARGV[4]  the queue
-- ARGV[5..12]  the subscriber, the claim's time (µs), the lease's end ("" for none), the
--          owner, the member's state after the claim, the claim's journal steps (JSON),
--          the states AVAILABLE and REVEALED
-- ARGV[13] the number of entries n; then each: msg_id, broker reference, ordering key
--          ("" for none); then n lease tokens, the k-th claim taking the k-th
--
-- Returns {"ok", results}: per entry, comma-separated in the order sent, "-" for one
-- left to the client, "<attempt>:<max attempts>" for one claimed.

local rp, wid, ttl, queue = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local csub, cat, cuntil, cowner = ARGV[5], tonumber(ARGV[6]), ARGV[7], ARGV[8]
local cstate, csteps, available, revealed = ARGV[9], ARGV[10], ARGV[11], ARGV[12]
local n = tonumber(ARGV[13])
local e0, t0 = 14, 14 + 3 * n
local ckey = rp .. 'c:' .. queue .. '/' .. csub
local rkey = rp .. 'r:' .. queue .. '/' .. csub
local dkey = rp .. 'd:' .. queue
local function next_token(k)
  return ARGV[t0 + k - 1]
end

{claim_member}

local out, seen, held = {}, {}, {}
for i = 1, n do
  local b = e0 + 3 * (i - 1)
  local id, ref, key = ARGV[b], ARGV[b + 1], ARGV[b + 2]
  local res = '-'
  if id ~= '' and not seen[id] and not (key ~= '' and held[key]) then
    local f = redis.call('HMGET', rp .. 'm:' .. id, 'v', 's', 'n', 'r', 'u', 'mo', 'x', 'lk',
      'ix', 'h', 'q')
    if f[1] and f[11] == queue and f[3] == ref then
      local over = {}
      if f[6] and f[6] ~= '' then
        over = redis.call('HGETALL', rp .. 'ms:' .. id)
      end
      local token, attempt, most = claim(id, f, over)
      if token then
        res = num(attempt) .. ':' .. num(most)
      end
    end
  end
  if id ~= '' then
    seen[id] = true
  end
  if res == '-' and key ~= '' then
    held[key] = true
  end
  out[i] = res
end

write_claims_journal(queue)
local reply = {'ok', table.concat(out, ',')}
if jn then
  redis.call('SET', rp .. 'done:' .. wid, table.concat(reply, ' '), 'EX', ttl)
end
return reply
