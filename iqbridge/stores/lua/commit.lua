-- Commit a batch of changes to the Redis index store: all of them or none.
--
-- KEYS[1]  the store's record sequence counter (every key of a store shares its hash
--          tag, so naming one routes the script to the right node of a cluster)
-- KEYS[2]  (only with "xn" below) the stream that broker entries go to
-- ARGV[1]  the key prefix, "{iq:<prefix>}:"
-- ARGV[2]  this commit's write id, kept on every record it writes (a client that lost
--          the reply asks the record whether its commit applied)
-- ARGV[3]  the batch, JSON: a list of changes, each
--          {id, c (1 = new message), ev (expected version), v (new version), q (queue),
--           p (priority), n (native ref or ""), nj (number of journal values),
--           xn (number of broker entry values, or absent), f ([[field, value]] extra
--           record fields), ks / kc / kd (index keys scored by put order / claim order /
--           due time), due (due time or "")}
--          Every number the script writes back arrives as a string: Lua numbers print
--          with 14 digits, too few for microsecond timestamps.
-- ARGV[4...] per change, in batch order: the record JSON; then its nj journal values
--          (JSON arrays of at most 65536 entries each); then, with xn > 0, the xn
--          field/value pairs of a broker entry to XADD to KEYS[2] (a put through the
--          Redis Streams adapter on the same server: the record keeps the entry id as
--          its native ref, so record and entry appear together or not at all).
--          Kept out of the batch JSON so that they are neither escaped nor parsed.
--
-- Returns {"ok", seq, ...} (each record's put-order seq, in batch order, then, with
-- KEYS[2], each change's entry id or "" in batch order), or {"stale", msg_id} when a
-- record no longer has its expected version (or exists already, for a new message);
-- then nothing was written.

local P = ARGV[1]
local wid = ARGV[2]
local batch = cjson.decode(ARGV[3])
-- claim order: priority first (higher first), then put order
local SHIFT = 1099511627776 -- 2^40

-- Compare-and-set on every record before anything is written.
local seen = {}
for _, ch in ipairs(batch) do
  if seen[ch.id] then
    return {'stale', ch.id}
  end
  seen[ch.id] = true
  local v = redis.call('HGET', P .. 'm:' .. ch.id, 'v')
  if ch.c == 1 then
    if v then
      return {'stale', ch.id}
    end
  elseif v ~= ch.ev then
    return {'stale', ch.id}
  end
end

local out, refs, argi = {'ok'}, {}, 4
for _, ch in ipairs(batch) do
  local key = P .. 'm:' .. ch.id
  local record = ARGV[argi]
  argi = argi + 1
  local seq, hist, native, oldix
  if ch.c == 1 then
    seq = redis.call('INCR', KEYS[1])
    hist = ''
    native = ch.n
    oldix = {}
    redis.call('SADD', P .. 'queues', ch.q)
  else
    local old = redis.call('HMGET', key, 's', 'h', 'n', 'ix')
    seq = tonumber(old[1])
    hist = old[2] or ''
    native = ch.n
    if native == '' then
      native = old[3] or ''
    end
    oldix = cjson.decode(old[4] or '[]')
  end
  local s = string.format('%.0f', seq)

  -- The journal: one stream entry per journal value (65536 entries at most), id "<n>-0"
  -- from a counter; the record lists its entries' n.
  for _ = 1, tonumber(ch.nj) do
    local n = string.format('%.0f', redis.call('INCR', P .. 'jseq'))
    redis.call('XADD', P .. 'journal', n .. '-0', 'm', ch.id, 'q', ch.q, 'e', ARGV[argi])
    argi = argi + 1
    if hist == '' then
      hist = n
    else
      hist = hist .. ',' .. n
    end
  end

  -- The broker entry of a put, when the stream lives on this server.
  local xn = tonumber(ch.xn) or 0
  if xn > 0 then
    native = redis.call('XADD', KEYS[2], '*', unpack(ARGV, argi, argi + xn - 1))
    argi = argi + xn
  end
  refs[#refs + 1] = xn > 0 and native or ''

  -- Secondary indexes: add the record to its keys now, drop it from the others. A
  -- put-order or claim-order score never changes for a record, so a key it is in
  -- already is left alone; due times move, so those are always written.
  local had = {}
  for _, k in ipairs(oldix) do
    had[k] = true
  end
  local ix, keep = {}, {}
  for _, k in ipairs(ch.ks) do
    if not had[k] then
      redis.call('ZADD', k, s, ch.id)
    end
    ix[#ix + 1] = k
    keep[k] = true
  end
  if #ch.kc > 0 then
    local score = string.format('%.0f', seq - ch.p * SHIFT)
    for _, k in ipairs(ch.kc) do
      if not had[k] then
        redis.call('ZADD', k, score, ch.id)
      end
      ix[#ix + 1] = k
      keep[k] = true
    end
  end
  for _, k in ipairs(ch.kd) do
    redis.call('ZADD', k, ch.due, ch.id)
    ix[#ix + 1] = k
    keep[k] = true
  end
  for _, k in ipairs(oldix) do
    if not keep[k] then
      redis.call('ZREM', k, ch.id)
    end
  end

  -- The record itself, rewritten whole.
  local fields = {'v', ch.v, 's', s, 'q', ch.q, 'r', record, 'h', hist, 'w', wid}
  if #ix > 0 then
    fields[#fields + 1] = 'ix'
    fields[#fields + 1] = cjson.encode(ix)
  end
  if native ~= '' then
    fields[#fields + 1] = 'n'
    fields[#fields + 1] = native
  end
  for _, f in ipairs(ch.f) do
    fields[#fields + 1] = f[1]
    fields[#fields + 1] = f[2]
  end
  redis.call('DEL', key)
  redis.call('HSET', key, unpack(fields))
  out[#out + 1] = seq
end
if KEYS[2] then
  for _, ref in ipairs(refs) do
    out[#out + 1] = ref
  end
end
return out
