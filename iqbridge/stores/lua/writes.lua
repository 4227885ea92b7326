-- Commit a batch's writes (iqbridge.writes.Writes) to the Redis index store in one call:
-- every record whose compare-and-set holds ("each"), or all of them or none ("all"),
-- with the batch's journal written per transition group, not per message.
--
-- KEYS[1]  the store's record sequence counter (names the hash tag's node)
-- KEYS[2]  (only for a put with broker entries, or a settle with acknowledgements) the
--          stream the entries go to, or whose entries are acknowledged
-- ARGV[1]  the key prefix, "{iq:<prefix>}:"
-- ARGV[2]  this commit's write id (kept on every record it writes; the reply is kept
--          under "done:<write id>" for a client that lost it)
-- ARGV[3]  "each" or "all"
-- ARGV[4]  seconds to keep the reply under "done:<write id>"
-- ARGV[5]  the queue
-- ARGV[6]  the number of shapes; then each shape (what records moved alike share):
--            ix (JSON list of every index key the record is in after the change, kept
--            for purge), nks then nks index keys to add it to by put order, nkc then nkc
--            index keys to add it to by claim order, ng then ng index keys to take it
--            out of, nf then nf optional field names to set (values per record), nu
--            then nu optional field names to remove
-- then     the number of records; then each record:
--            id, c (1 = new, 0 = moved, 2 = moved in its members only), ev (expected
--            version), v (new version), shape number, p (priority), n (native ref or
--            ""), r (the record JSON; for c = 2, the publisher state or "-" for
--            unchanged, then each changed member's subscriber and row, joined by
--            newlines: they go to the hash "ms:<id>", the publisher state under the
--            field "", and the record JSON is not rewritten), due (the due time
--            to index it under in "d:<queue>", or ""), the shape's nf field values,
--            nj then nj journal values of its own (JSON arrays, a change made one
--            message at a time), xn then xn field/value values of a broker entry to XADD
--            to KEYS[2], nb then nb values (0, or 2: a new message's retained body and
--            headers JSON, kept in the hash "b:<id>")
-- then     the number of journal groups; then each group (Steps): its head, the JSON
--          text "[at,[[actor,kind,src,dst,detail],...]" (without the closing bracket of
--          the group), ns (entries per message), ni, then ni pairs: the record's number
--          in this batch, its attempt.
-- then     (optional) the number of acknowledgements; then each: the record's number,
--          the consumer group, the entry id, XACKed on KEYS[2] if the record holds (a
--          settle through Redis Streams on the index's server: the outcome and the
--          acknowledgement together).
--
-- A group's messages whose record holds are written in journal rows of at most 65535
-- entries: the stream entry "<n>-0" with fields m "" (a batch row), q and e
-- {"b":[[at,steps,[[msg_id,attempt],...]],...]} (stores/codec.py expands it); each
-- record lists the rows holding its entries in its field "h".
--
-- Returns {"ok", seqs} (each record's put-order seq in batch order, 0 for one that did
-- not hold, joined by commas; then, with KEYS[2], each record's entry id or "", joined
-- by commas: two bulk replies, not one per record), or, in "all" mode, {"stale",
-- msg_id} when a record no longer has its expected version (or exists already, for a
-- new one); then nothing was written. What applied is kept under "done:<write id>" as
-- the reply's values joined by spaces.

local P, wid, each, ttl, q = ARGV[1], ARGV[2], ARGV[3] == 'each', ARGV[4], ARGV[5]
local SHIFT = 1099511627776 -- 2^40: claim order is priority first, then put order
local PER_ROW = 65535

local shapes = {}
local a = 7
for s = 1, tonumber(ARGV[6]) do
  local sh = {ix = ARGV[a]}
  a = a + 1
  sh.nks, sh.ks0 = tonumber(ARGV[a]), a + 1
  a = a + 1 + sh.nks
  sh.nkc, sh.kc0 = tonumber(ARGV[a]), a + 1
  a = a + 1 + sh.nkc
  sh.ng, sh.g0 = tonumber(ARGV[a]), a + 1
  a = a + 1 + sh.ng
  sh.nf, sh.f0 = tonumber(ARGV[a]), a + 1
  a = a + 1 + sh.nf
  sh.nu, sh.u0 = tonumber(ARGV[a]), a + 1
  a = a + 1 + sh.nu
  shapes[s] = sh
end

local batch = {}
local nrec = tonumber(ARGV[a])
a = a + 1
for i = 1, nrec do
  local sh = shapes[tonumber(ARGV[a + 4])]
  local ch = {
    id = ARGV[a], c = ARGV[a + 1], ev = ARGV[a + 2], v = ARGV[a + 3], sh = sh,
    p = tonumber(ARGV[a + 5]), n = ARGV[a + 6], r = ARGV[a + 7], due = ARGV[a + 8],
    f0 = a + 9, nj = 0, j0 = 0, xn = 0, x0 = 0, nb = 0, b0 = 0, hist = false, ok = false,
  }
  a = a + 9 + sh.nf
  ch.nj, ch.j0 = tonumber(ARGV[a]), a + 1
  a = a + 1 + ch.nj
  ch.xn, ch.x0 = tonumber(ARGV[a]), a + 1
  a = a + 1 + ch.xn
  ch.nb, ch.b0 = tonumber(ARGV[a]), a + 1
  a = a + 1 + ch.nb
  batch[i] = ch
end

-- Compare-and-set on every record before anything is written.
local seen = {}
for _, ch in ipairs(batch) do
  local stale = seen[ch.id]
  if not stale then
    seen[ch.id] = true
    local old = redis.call('HMGET', P .. 'm:' .. ch.id, 'v', 's', 'h', 'n', 'mo')
    if ch.c == '1' then
      stale = old[1] ~= false
    else
      stale = old[1] ~= ch.ev
    end
    ch.old = old
  end
  if stale then
    if not each then
      return {'stale', ch.id}
    end
  else
    ch.ok = true
    if ch.c == '1' then
      ch.hist = ''
    else
      ch.hist = ch.old[3] or ''
    end
  end
end

local function note(ch, n)
  if ch.hist == '' then
    ch.hist = n
  elseif ch.last ~= n then
    ch.hist = ch.hist .. ',' .. n
  end
  ch.last = n
end

-- The templated journal: groups of what holds, in rows of at most PER_ROW entries.
local ngroups = tonumber(ARGV[a])
a = a + 1
local row, size, rown = {}, 0, false
local function flush()
  if #row > 0 then
    redis.call('XADD', P .. 'journal', rown .. '-0', 'm', '', 'q', q,
      'e', '{"b":[' .. table.concat(row, ',') .. ']}')
  end
  row, size, rown = {}, 0, false
end
for _ = 1, ngroups do
  local head, per, ni = ARGV[a], tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  if per < 1 then per = 1 end
  a = a + 3
  local items = {}
  for k = a, a + 2 * ni - 1, 2 do
    local ch = batch[tonumber(ARGV[k])]
    if ch and ch.ok then
      if size + per > PER_ROW then
        if #items > 0 then
          row[#row + 1] = head .. ',[' .. table.concat(items, ',') .. ']]'
          items = {}
        end
        flush()
      end
      if not rown then
        rown = string.format('%.0f', redis.call('INCR', P .. 'jseq'))
      end
      local id = ch.id
      if string.find(id, '["\\]') or string.find(id, '%c') then
        id = cjson.encode(id)
      else
        id = '"' .. id .. '"'
      end
      items[#items + 1] = '[' .. id .. ',' .. ARGV[k + 1] .. ']'
      size = size + per
      note(ch, rown)
    end
  end
  a = a + 2 * ni
  if #items > 0 then
    row[#row + 1] = head .. ',[' .. table.concat(items, ',') .. ']]'
  end
end
flush()

-- Acknowledgements of what holds, one XACK per group.
local nacks = tonumber(ARGV[a] or '0')
a = a + 1
if nacks > 0 then
  local by_group, order = {}, {}
  for k = a, a + 3 * nacks - 1, 3 do
    local ch = batch[tonumber(ARGV[k])]
    if ch and ch.ok then
      local refs = by_group[ARGV[k + 1]]
      if not refs then
        refs = {}
        by_group[ARGV[k + 1]] = refs
        order[#order + 1] = ARGV[k + 1]
      end
      refs[#refs + 1] = ARGV[k + 2]
    end
  end
  for _, group in ipairs(order) do
    redis.call('XACK', KEYS[2], group, unpack(by_group[group]))
  end
end

local out, refs = {}, {}
local any = false
for _, ch in ipairs(batch) do
  if not ch.ok then
    out[#out + 1] = '0'
    refs[#refs + 1] = ''
  else
    any = true
    local key = P .. 'm:' .. ch.id
    local old, sh = ch.old, ch.sh
    local seq
    if ch.c == '1' then
      seq = redis.call('INCR', KEYS[1])
    else
      seq = tonumber(old[2])
    end
    local native = ch.n
    if native == '' then
      native = old[4] or ''
    end
    local s = string.format('%.0f', seq)

    -- Journal values of its own (a change made one message at a time).
    for j = ch.j0, ch.j0 + ch.nj - 1 do
      local n = string.format('%.0f', redis.call('INCR', P .. 'jseq'))
      redis.call('XADD', P .. 'journal', n .. '-0', 'm', ch.id, 'q', q, 'e', ARGV[j])
      note(ch, n)
    end

    if ch.xn > 0 then
      native = redis.call('XADD', KEYS[2], '*', unpack(ARGV, ch.x0, ch.x0 + ch.xn - 1))
    end
    refs[#refs + 1] = ch.xn > 0 and native or ''

    for k = sh.ks0, sh.ks0 + sh.nks - 1 do
      redis.call('ZADD', ARGV[k], s, ch.id)
    end
    if sh.nkc > 0 then
      local score = string.format('%.0f', seq - ch.p * SHIFT)
      for k = sh.kc0, sh.kc0 + sh.nkc - 1 do
        redis.call('ZADD', ARGV[k], score, ch.id)
      end
    end
    if ch.due ~= '' then
      redis.call('ZADD', P .. 'd:' .. q, ch.due, ch.id)
    end
    for k = sh.g0, sh.g0 + sh.ng - 1 do
      redis.call('ZREM', ARGV[k], ch.id)
    end

    local fields
    if ch.c == '2' then
      -- Moved in its members only: their rows (and the publisher state, if it moved) go
      -- over the record JSON, which stays as it was (stores/redis_records.py).
      local over, k = {}, 0
      for part in string.gmatch(ch.r, '[^\n]+') do
        k = k + 1
        if k == 1 then
          if part ~= '-' then
            over[#over + 1] = ''
            over[#over + 1] = part
          end
        else
          over[#over + 1] = part
        end
      end
      if #over > 0 then
        redis.call('HSET', P .. 'ms:' .. ch.id, unpack(over))
      end
      fields = {'v', ch.v, 's', s, 'q', q, 'h', ch.hist, 'w', wid, 'ix', sh.ix, 'mo', '1'}
    else
      fields = {'v', ch.v, 's', s, 'q', q, 'r', ch.r, 'h', ch.hist, 'w', wid, 'ix', sh.ix}
    end
    if native ~= '' then
      fields[#fields + 1] = 'n'
      fields[#fields + 1] = native
    end
    for k = 0, sh.nf - 1 do
      fields[#fields + 1] = ARGV[sh.f0 + k]
      fields[#fields + 1] = ARGV[ch.f0 + k]
    end
    if ch.c ~= '2' and old[5] and old[5] ~= '' then
      -- Member rows written apart: the record written now holds them.
      redis.call('DEL', P .. 'ms:' .. ch.id)
      fields[#fields + 1] = 'mo'
      fields[#fields + 1] = ''
    end
    redis.call('HSET', key, unpack(fields))
    if sh.nu > 0 then
      redis.call('HDEL', key, unpack(ARGV, sh.u0, sh.u0 + sh.nu - 1))
    end
    if ch.nb > 0 then
      redis.call('HSET', P .. 'b:' .. ch.id, 'b', ARGV[ch.b0], 'h', ARGV[ch.b0 + 1])
    end
    out[#out + 1] = s
  end
end
local reply = {'ok', table.concat(out, ',')}
if KEYS[2] then
  reply[3] = table.concat(refs, ',')
end
if any then
  redis.call('SADD', P .. 'queues', q)
  -- A client that lost this reply reads it here instead of committing again.
  redis.call('SET', P .. 'done:' .. wid, table.concat(reply, ' '), 'EX', ttl)
end
return reply
