"""The wire format of the Redis Streams adapter (how an envelope travels in a stream
entry's fields) and the receive script, for :mod:`iqbridge.adapters.redis_streams`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import orjson

from iqbridge.adapter import ClaimOnReceive
from iqbridge.engine_batch import claim_plan
from iqbridge.ids import adopted_id
from iqbridge.model import Envelope, MessageRecord
from iqbridge.stores.redis_records import compose_record
from iqbridge.stores.redis_scripts import lua_fragment

__all__ = [
    "RECEIVE_SCRIPT",
    "claim_args",
    "decode_fields",
    "encode_fields",
    "envelope_of",
    "pairs",
    "record_of",
]

_PAYLOAD = b"payload"
_H = "iq-h-"

#: One round trip per receive, over one or more groups in order until one has entries:
#: per group, entries a read whose reply was lost moved to this consumer (with an id
#: after the given one: ``XREADGROUP`` of the consumer's own pending entries) first, then
#: entries given back to it (held by the reserved requeue consumer), then entries idle
#: for ``min_idle`` (a crashed consumer's), then new ones. Entries
#: addressed (``iq-to``) to other groups only are acknowledged for the group on the way
#: and never leave the server. Held acknowledgements of each group go first. With a
#: record prefix (the Redis index on the same server), each entry's index record is read
#: too. Returns rows [id, how, group number, payload, JSON {"f": other fields, "r":
#: record [v, s, n, r, u, {subscriber, member row, ...}] or false, "t": the claim's
#: token, "a" and "ma": the member's attempt and the message's max attempts, if
#: claimed}] for iqbridge entries and [id, how, group number, flat fields] for others
#: (a legacy producer's); how = 1 for a first delivery, 2 for a redelivery, 3 for
#: one read again after a lost reply. The reply is {rows, numbers of the groups whose
#: pending entries were read again to their end}.
#:
#: With a subscriber to claim for, the script also claims, among the first rows it
#: returns and up to the first it cannot claim (an unbroken run, so a client killed
#: before it claims the rest leaves no later message of a key claimed ahead of an
#: earlier one), each entry of the subscriber's own group whose message is on the claim's
#: common path (the member AVAILABLE and in no pool, the message REVEALED, not locked,
#: without a time limit, past any retry delay, the entry its native ref): the member's
#: row goes to the hash "ms:<msg_id>" (FETCHED, the token, owner and lease; the record
#: JSON is not rewritten), the record's version and time move on, the message leaves
#: the claim-order indexes and enters the due index, and the journal gets one entry
#: per batch listing the claims. The record in the row is the one from before the
#: claim: the client applies the same claim to it (iqbridge.engine_batch.claim).
#:
#: ARGV: consumer, idle ms, requeue consumer, scan limit, record prefix ("" for none),
#: number of groups, then per group: name, count, the id after which to read its own
#: pending entries again ("" for none), number of acks, the acks; then the claim's 15
#: values (see the script). An entry read again after a lost reply whose member a claim
#: with this client's token prefix holds comes back claimed with that claim's token
#: (its record as it stands), so a lost reply costs no lease.
RECEIVE_SCRIPT = """
local key = KEYS[1]
local consumer, idle, requeue = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local scan, rp, ngroups = tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6])
local groups, counts, afters = {}, {}, {}
local a = 7
for g = 1, ngroups do
  groups[g], counts[g], afters[g] = ARGV[a], tonumber(ARGV[a + 1]), ARGV[a + 2]
  local nacks = tonumber(ARGV[a + 3])
  a = a + 4
  if nacks > 0 then
    redis.call('XACK', key, groups[g], unpack(ARGV, a, a + nacks - 1))
  end
  a = a + nacks
end
-- The claim on receive (see the docstring): after the groups, the subscriber ("" for
-- none), the claim's time, lease end ("" for none), owner, token prefix, how many rows
-- at most to claim, the member's state after the claim, the claim's journal steps
-- (JSON), its claim-order, redeliverable and due index keys, the states AVAILABLE
-- and REVEALED, the queue, and the prefix every token of this client starts with.
local csub, cat, cuntil, cowner, ctok, climit = ARGV[a], tonumber(ARGV[a + 1]), ARGV[a + 2],
  ARGV[a + 3], ARGV[a + 4], tonumber(ARGV[a + 5])
local cstate, csteps, ckey, rkey, dkey = ARGV[a + 6], ARGV[a + 7], ARGV[a + 8], ARGV[a + 9],
  ARGV[a + 10]
local available, revealed, mine = ARGV[a + 11], ARGV[a + 12], ARGV[a + 14]
-- Claims are one unbroken run of the rows: once a row of the subscriber's group is
-- left to the client, no later row is claimed here (a client killed before its own
-- claim must not leave later messages claimed and earlier ones not: the next holder
-- hands claimed ones out again first, and a key's order would break).
local cstop = false
local function next_token(n)
  return ctok .. string.format('%04x', n)
end

{claim_member}
local out, reread = {}, {}
local function field(fields, name)
  for i = 1, #fields, 2 do
    if fields[i] == name then
      return fields[i + 1]
    end
  end
  return nil
end
for g = 1, ngroups do
  local group, count, got = groups[g], counts[g], 0
  local function take(entries, how)
    for _, e in ipairs(entries) do
      local fields = e[2]
      if type(fields) == 'table' then
        local to = field(fields, 'iq-to')
        if to == nil or string.find(' ' .. to .. ' ', ' ' .. group .. ' ', 1, true) then
          local id = field(fields, 'iq-id')
          if id then
            -- An iqbridge entry: the payload as it is, everything else in one JSON
            -- text (a few reply elements instead of two per field).
            local meta, body = {}, ''
            for i = 1, #fields, 2 do
              if fields[i] == 'payload' then
                body = fields[i + 1]
              else
                meta[fields[i]] = fields[i + 1]
              end
            end
            local rec, token, attempt, most = false, nil, nil, nil
            if rp ~= '' then
              local f = redis.call('HMGET', rp .. 'm:' .. id, 'v', 's', 'n', 'r', 'u', 'mo',
                'x', 'lk', 'ix', 'h')
              if f[1] then
                local over = {}
                if f[6] and f[6] ~= '' then
                  over = redis.call('HGETALL', rp .. 'ms:' .. id)
                end
                rec = {f[1], f[2], f[3], f[4], f[5] or false, over}
                if csub == group and not cstop and #out < climit and f[3] == e[1] then
                  if how == 3 and #over > 0 then
                    -- Read again after a lost reply: claimed by that read, whose tokens
                    -- start with this client's prefix? Then it is this claim's.
                    for i = 1, #over, 2 do
                      if over[i] == csub then
                        local row = cjson.decode(over[i + 1])
                        if row[3] == cstate and type(row[6]) == 'string'
                            and string.sub(row[6], 1, #mine) == mine then
                          token, attempt, most = row[6], row[5], cjson.decode(f[4])[13]
                        end
                      end
                    end
                  end
                  if not token then
                    token, attempt, most = claim(id, f, over)
                  end
                end
              end
            end
            out[#out + 1] = {e[1], how, g, body,
              cjson.encode({f = meta, r = rec, t = token, a = attempt, ma = most})}
            if not token and csub == group then cstop = true end
          else
            out[#out + 1] = {e[1], how, g, fields}
            if csub == group then cstop = true end
          end
          got = got + 1
        else
          redis.call('XACK', key, group, e[1])
        end
      end
    end
  end
  if afters[g] ~= '' then
    local reply = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', count,
      'STREAMS', key, afters[g])
    local entries = reply and reply[1][2] or {}
    take(entries, 3)
    if #entries < count then
      reread[#reread + 1] = g
    end
  end
  local pending = {}
  if got < count then
    pending = redis.call('XPENDING', key, group, '-', '+', count - got, requeue)
  end
  if #pending > 0 then
    local ids = {}
    for i, row in ipairs(pending) do ids[i] = row[1] end
    take(redis.call('XCLAIM', key, group, consumer, 0, unpack(ids)), 2)
  end
  if idle > 0 and got < count then
    take(redis.call('XAUTOCLAIM', key, group, consumer, idle, '0-0', 'COUNT', count - got)[2], 2)
  end
  local scanned = 0
  while got < count and scanned < scan do
    local reply = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', count - got,
      'STREAMS', key, '>')
    if not reply then break end
    local entries = reply[1][2]
    if #entries == 0 then break end
    scanned = scanned + #entries
    take(entries, 1)
  end
  if got > 0 then
    break
  end
end
write_claims_journal(ARGV[a + 13])
return {out, reread}
""".replace("{claim_member}", lua_fragment("claim_member"))


def claim_args(
    queue: str, prefix: str, claim: ClaimOnReceive, limit: int, tokens: str, mine: str
) -> list[Any]:
    """The receive script's values for a claim on receive, made now (``claim.at``,
    ``claim.lease_until`` and ``claim.tokens`` are reset for it): at most ``limit``
    claims, their tokens ``tokens`` and a number, ``mine`` the prefix of every token of
    this client (index key prefix ``prefix``)."""
    sub = claim.subscriber
    claim.tokens.clear()
    claim.at = at = claim.now()
    claim.lease_until = until = at + claim.lease_us if claim.lease_us is not None else None
    plan = claim_plan(sub, claim.owner, until)
    return [
        sub,
        str(at),
        "" if until is None else str(until),
        plan.owner,
        tokens,
        limit,
        plan.dst.value,
        orjson.dumps(plan.steps).decode(),
        f"{prefix}c:{queue}/{sub}",
        f"{prefix}r:{queue}/{sub}",
        f"{prefix}d:{queue}",
        plan.src.value,
        plan.revealed.value,
        queue,
        mine,
    ]


def encode_fields(env: Envelope) -> dict[str, bytes | str]:
    """The stream entry for an envelope: the payload unchanged in ``payload``."""
    fields: dict[str, bytes | str] = {
        "payload": env.body,
        "iq-id": env.msg_id,
        "iq-ct": env.content_type,
        "iq-pub": env.publisher,
        "iq-prio": str(env.priority),
        "iq-at": str(env.put_at),
    }
    if env.correlation_id is not None:
        fields["iq-corr"] = env.correlation_id
    if env.ordering_key:
        fields["iq-key"] = env.ordering_key
    if env.parents:
        fields["iq-parents"] = json.dumps(list(env.parents))
    if env.groups:
        fields["iq-to"] = " ".join(env.groups)
    for name, value in env.headers.items():
        fields[f"{_H}{name}"] = value
    return fields


#: The fields of a stream entry that are each message's own, first in every entry, in
#: this order (see :func:`encode_fields`); the rest a put's alike messages share.
OWN_FIELDS = ("payload", "iq-id")


def kind_fields(envelopes: Sequence[Envelope], kinds: Sequence[int]) -> list[list[bytes | str]]:
    """The entry fields (flat field/value values) after :data:`OWN_FIELDS` of each kind of
    message (``kinds``: one number per envelope; envelopes of one kind differ only in
    msg_id and body), by kind number."""
    firsts: dict[int, Envelope] = {}
    for env, kind in zip(envelopes, kinds, strict=True):
        firsts.setdefault(kind, env)
    out: list[list[bytes | str]] = [[] for _ in range(max(firsts, default=-1) + 1)]
    for kind, env in firsts.items():
        out[kind] = [
            part
            for name, value in encode_fields(env).items()
            if name not in OWN_FIELDS
            for part in (name, value)
        ]
    return out


def decode_fields(stream: str, ref: str, raw: dict[bytes, bytes]) -> tuple[Envelope, bool]:
    """The envelope of a stream entry, and whether it was adopted (no ``iq-id``)."""
    if b"iq-id" not in raw:
        return _adopt(stream, ref, raw), True
    text = {
        k.decode("utf-8", "replace"): v.decode("utf-8", "replace")
        for k, v in raw.items()
        if k != _PAYLOAD
    }
    return envelope_of(raw.get(_PAYLOAD, b""), text), False


def envelope_of(body: bytes, text: dict[str, str]) -> Envelope:
    """The envelope of an iqbridge entry from its payload and its other fields as text."""
    get = text.get
    try:
        priority = int(get("iq-prio", "4"))
        put_at = int(get("iq-at", "0"))
        listed = get("iq-parents")
        parents = tuple(str(p) for p in json.loads(listed)) if listed else ()
    except (ValueError, TypeError):
        priority, put_at, parents = 4, 0, ()
    to = get("iq-to")
    return Envelope(
        msg_id=text["iq-id"],
        body=body,
        content_type=get("iq-ct", "application/octet-stream"),
        headers={k[len(_H) :]: v for k, v in text.items() if k.startswith(_H)},
        publisher=get("iq-pub", ""),
        correlation_id=get("iq-corr"),
        priority=priority,
        ordering_key=get("iq-key", ""),
        parents=parents,
        put_at=put_at,
        groups=tuple(to.split()) if to else (),
    )


def _adopt(stream: str, ref: str, raw: dict[bytes, bytes]) -> Envelope:
    """A legacy producer's entry: payload from ``payload``, its only field, or all fields."""
    if _PAYLOAD in raw:
        body, ctype = raw[_PAYLOAD], "application/octet-stream"
    elif len(raw) == 1:
        body, ctype = next(iter(raw.values())), "application/octet-stream"
    else:
        obj = {k.decode("utf-8", "replace"): v.decode("utf-8", "replace") for k, v in raw.items()}
        body, ctype = json.dumps(obj, sort_keys=True).encode(), "application/json"
    return Envelope(
        msg_id=adopted_id("redis-streams", stream, ref),
        body=body,
        content_type=ctype,
        publisher="(legacy)",
    )


def pairs(flat: Sequence[Any]) -> dict[bytes, bytes]:
    """A Lua script's flat [field, value, ...] reply as a dict."""
    return {bytes(flat[i]): bytes(flat[i + 1]) for i in range(0, len(flat), 2)}


def record_of(msg_id: str, flat: Sequence[Any]) -> MessageRecord | None:
    """An index record read by the receive script ([v, s, n, r, u, member rows written
    apart], JSON false for a field that is missing), or None if it has none."""
    v, seq, native, body, updated, rows = flat
    if not v or not body:
        return None
    return compose_record(msg_id, v, seq, native, body, updated, rows or ())
