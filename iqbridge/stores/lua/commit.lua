-- Commit a batch of changes to the Redis index store: all of them or none ("all"), or
-- each one whose compare-and-set holds ("each").
--
-- KEYS[1]  the store's record sequence counter (every key of a store shares its hash
--          tag, so naming one routes the script to the right node of a cluster)
-- KEYS[2]  (only when a change adds a broker entry) the stream the entries go to
-- ARGV[1]  the key prefix, "{iq:<prefix>}:"
-- ARGV[2]  this commit's write id, kept on every record it writes (a client that lost
--          the reply asks the record whether its commit applied)
-- ARGV[3]  the mode: "all" (a stale change writes nothing at all) or "each" (a stale
--          change, or a later change of a message already in the batch, is skipped and
--          the others are written)
-- ARGV[4]  in "each" mode: for how many seconds to keep the reply under
--          "done:<write id>", for a client that lost it
-- ARGV[5]  the number of changes; then each change as positional values (nothing here
--          parses JSON), in this order:
--            id, c (1 = new message), ev (expected version), v (new version), q (queue),
--            p (priority), n (native ref or ""), r (the record JSON), ix (JSON list of
--            every index key the record is in after the change, kept for purge),
--            due (the due time to index it under in "d:<queue>", or "" to leave that),
--            nf, then nf field/value values (optional record fields to set),
--            nu, then nu field names to remove (optional fields no longer set),
--            nks, then nks index keys to add it to, scored by put order,
--            nkc, then nkc index keys to add it to, scored by claim order,
--            ngone, then ngone index keys to take it out of,
--            nj, then nj journal values (JSON arrays of at most 65536 entries each),
--            xn, then xn field/value values of a broker entry to XADD to KEYS[2] (a put
--            through the Redis Streams adapter on the same server: the record keeps the
--            entry id as its native ref, so record and entry appear together or not at
--            all),
--            nb, then nb values: 0, or 2 for a new message's retained payload copy (body
--            bytes, headers JSON), kept in the hash "b:<id>" (fields b and h).
--          The client works out which index entries change from the record the change
--          started from; compare-and-set on the version makes that the stored one.
--          Numbers arrive as strings: Lua numbers print with 14 digits, too few for
--          microsecond timestamps.
--
-- Returns {"ok", seq, ...} (each record's put-order seq, in batch order, 0 for a change
-- skipped in "each" mode; then, with KEYS[2], each change's entry id or "" in batch
-- order), or, in "all" mode, {"stale", msg_id} when a record no longer has its expected
-- version (or exists already, for a new message); then nothing was written.

local P = ARGV[1]
local wid = ARGV[2]
local each = ARGV[3] == 'each'
-- claim order: priority first (higher first), then put order
local SHIFT = 1099511627776 -- 2^40

-- One table constructor per change (Lua sizes it once; adding fields one at a time
-- rehashes it five times) and no function calls: this runs on every commit.
local batch = {}
local a = 6
for i = 1, tonumber(ARGV[5]) do
  local ch = {
    id = ARGV[a], c = ARGV[a + 1], ev = ARGV[a + 2], v = ARGV[a + 3], q = ARGV[a + 4],
    p = tonumber(ARGV[a + 5]), n = ARGV[a + 6], r = ARGV[a + 7], ix = ARGV[a + 8],
    due = ARGV[a + 9], nf = tonumber(ARGV[a + 10]), f0 = a + 11,
    nu = 0, u0 = 0, nks = 0, ks0 = 0, nkc = 0, kc0 = 0, ng = 0, g0 = 0, nj = 0, j0 = 0,
    xn = 0, x0 = 0, nb = 0, b0 = 0, old = false, skip = false,
  }
  a = ch.f0 + ch.nf
  ch.nu, ch.u0 = tonumber(ARGV[a]), a + 1
  a = a + 1 + ch.nu
  ch.nks, ch.ks0 = tonumber(ARGV[a]), a + 1
  a = a + 1 + ch.nks
  ch.nkc, ch.kc0 = tonumber(ARGV[a]), a + 1
  a = a + 1 + ch.nkc
  ch.ng, ch.g0 = tonumber(ARGV[a]), a + 1
  a = a + 1 + ch.ng
  ch.nj, ch.j0 = tonumber(ARGV[a]), a + 1
  a = a + 1 + ch.nj
  ch.xn, ch.x0 = tonumber(ARGV[a]), a + 1
  a = a + 1 + ch.xn
  ch.nb, ch.b0 = tonumber(ARGV[a]), a + 1
  a = a + 1 + ch.nb
  batch[i] = ch
end

-- Compare-and-set on every record before anything is written; keep what is read.
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
    ch.skip = true
  end
end

local out, refs, done = {'ok'}, {}, {}
for _, ch in ipairs(batch) do
  if ch.skip then
    out[#out + 1] = 0
    refs[#refs + 1] = ''
    done[#done + 1] = '0'
  else
    local key = P .. 'm:' .. ch.id
    local old = ch.old
    local seq, hist, native
    if ch.c == '1' then
      seq = redis.call('INCR', KEYS[1])
      hist = ''
      redis.call('SADD', P .. 'queues', ch.q)
    else
      seq = tonumber(old[2])
      hist = old[3] or ''
    end
    native = ch.n
    if native == '' then
      native = old[4] or ''
    end
    local s = string.format('%.0f', seq)

    -- The journal: one stream entry per journal value (65536 entries at most), id "<n>-0"
    -- from a counter; the record lists its entries' n.
    for a = ch.j0, ch.j0 + ch.nj - 1 do
      local n = string.format('%.0f', redis.call('INCR', P .. 'jseq'))
      redis.call('XADD', P .. 'journal', n .. '-0', 'm', ch.id, 'q', ch.q, 'e', ARGV[a])
      if hist == '' then
        hist = n
      else
        hist = hist .. ',' .. n
      end
    end

    -- The broker entry of a put, when the stream lives on this server.
    if ch.xn > 0 then
      native = redis.call('XADD', KEYS[2], '*', unpack(ARGV, ch.x0, ch.x0 + ch.xn - 1))
    end
    refs[#refs + 1] = ch.xn > 0 and native or ''

    -- Secondary indexes: only what changes (a put-order or claim-order score never does).
    for a = ch.ks0, ch.ks0 + ch.nks - 1 do
      redis.call('ZADD', ARGV[a], s, ch.id)
    end
    if ch.nkc > 0 then
      local score = string.format('%.0f', seq - ch.p * SHIFT)
      for a = ch.kc0, ch.kc0 + ch.nkc - 1 do
        redis.call('ZADD', ARGV[a], score, ch.id)
      end
    end
    if ch.due ~= '' then
      redis.call('ZADD', P .. 'd:' .. ch.q, ch.due, ch.id)
    end
    for a = ch.g0, ch.g0 + ch.ng - 1 do
      redis.call('ZREM', ARGV[a], ch.id)
    end

    -- The record itself.
    local fields = {'v', ch.v, 's', s, 'q', ch.q, 'r', ch.r, 'h', hist, 'w', wid, 'ix', ch.ix}
    if native ~= '' then
      fields[#fields + 1] = 'n'
      fields[#fields + 1] = native
    end
    for a = ch.f0, ch.f0 + ch.nf - 1 do
      fields[#fields + 1] = ARGV[a]
    end
    if old[5] and old[5] ~= '' then
      -- Member rows a claim on receive wrote apart: the record written now holds them.
      redis.call('DEL', P .. 'ms:' .. ch.id)
      fields[#fields + 1] = 'mo'
      fields[#fields + 1] = ''
    end
    redis.call('HSET', key, unpack(fields))
    if ch.nu > 0 then
      redis.call('HDEL', key, unpack(ARGV, ch.u0, ch.u0 + ch.nu - 1))
    end
    if ch.nb > 0 then
      redis.call('HSET', P .. 'b:' .. ch.id, 'b', ARGV[ch.b0], 'h', ARGV[ch.b0 + 1])
    end
    out[#out + 1] = seq
    done[#done + 1] = s
  end
end
if KEYS[2] then
  for _, ref in ipairs(refs) do
    out[#out + 1] = ref
  end
end
if each then
  -- A client that lost this reply reads it here instead of committing again.
  redis.call('SET', P .. 'done:' .. wid, table.concat(done, ','), 'EX', ARGV[4])
end
return out
