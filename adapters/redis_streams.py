"""Redis Streams: ``redis://[[user]:password@]host[:port][/db][?options]`` or ``rediss://``.

Native mapping (see docs/adapters/redis.md):

* a queue is a stream whose key is the queue name (``stream_prefix`` + name), so an
  iqbridge queue and an existing stream of the same name are one and the same;
* pubsub: one consumer group per subscriber; a pool: one group whose members are its
  consumers and compete; groups are created at id ``0`` so they see earlier entries;
* receive: ``XREADGROUP``; with ``min_idle``, ``XAUTOCLAIM`` first takes entries left idle
  by a crashed consumer; DONE is ``XACK``; UNUSABLE is ``XACK`` plus ``XADD`` to the
  dead-letter stream ``<stream>:dead`` in one ``MULTI``;
* requeue (Redis has none): the entry is ``XCLAIM``-ed to the reserved consumer
  ``iq-requeue`` of the group; every receive hands that consumer's entries out first;
* nothing is trimmed: entries stay after ``XACK`` until the index purges journalled
  messages (``XDEL``); never ``MAXLEN``.

Wire format: the payload bytes unchanged in the field ``payload``; the envelope in
``iq-*`` fields (``iq-id``, ``iq-ct``, ``iq-pub``, ``iq-corr``, ``iq-prio``, ``iq-key``,
``iq-parents``, ``iq-at``, and each header as ``iq-h-<name>``), so a consumer that knows
nothing of iqbridge reads ``payload`` as before. An entry without ``iq-id`` (a legacy
producer's ``XADD``) is adopted: its msg_id is derived from the stream and entry id, its
payload is the ``payload`` field if there is one, else the value of its only field, else
all its fields as a JSON object (``application/json``).

Options: ``prefix`` (the Redis index store's key prefix, default ``default``),
``stream_prefix`` (prepended to queue names to form stream keys, default none),
``retry_for`` (seconds to keep retrying a broken connection with backoff, default 30),
``read_ahead`` (entries a consumer reads per round trip and hands out on its next gets,
default 16; in a pool, what one member read ahead stays claimable by the others through
the index),
``socket_timeout`` and ``socket_connect_timeout`` (seconds, default 10 and 5). Its default
index is the Redis index store on the same server and database; it retries for
``retry_for`` too.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import orjson
import redis
from redis.backoff import NoBackoff
from redis.exceptions import AuthenticationError, RedisError, ResponseError
from redis.retry import Retry
from tenacity import (
    Retrying,
    before_sleep_log,
    retry_if_exception,
    stop_after_delay,
    wait_exponential,
    wait_random,
)

from iqbridge.adapter import Capabilities
from iqbridge.engine import Change
from iqbridge.errors import BrokerUnavailable, ConfigurationError, IQError
from iqbridge.ids import adopted_id
from iqbridge.inventory import Entry, Unacked
from iqbridge.model import Envelope, MessageRecord, Received
from iqbridge.redaction import get_logger
from iqbridge.stores.codec import record_from_json
from iqbridge.stores.redis import DirectScripts, RedisStore, transient

from .probes import redis_find_sent, redis_take_over  # noqa: TID251
from .redis_inventory import redis_entries, redis_unacked  # noqa: TID251

__all__ = ["REQUEUE_CONSUMER", "RedisStreamsAdapter", "decode_fields", "encode_fields"]

log = get_logger(__name__)

T = TypeVar("T")

#: The reserved consumer that holds entries given back to a group until someone reads them.
REQUEUE_CONSUMER = "iq-requeue"

_OPTIONS = frozenset(
    {
        "prefix",
        "stream_prefix",
        "retry_for",
        "socket_timeout",
        "socket_connect_timeout",
        "read_ahead",
    }
)
#: Options the index store reads too (passed on to its URL).
_INDEX_OPTIONS = frozenset({"prefix", "socket_timeout", "socket_connect_timeout"})
#: Redis refuses a bulk string over 512 MB; leave room for the envelope fields.
_MAX_PAYLOAD = 512 * 1024 * 1024 - 64 * 1024

_PAYLOAD = b"payload"
_H = "iq-h-"

#: One round trip per receive, over one or more groups in order until one has entries:
#: per group, entries given back to it (held by the reserved requeue consumer) first,
#: then entries idle for ``min_idle`` (a crashed consumer's), then new ones. Entries
#: addressed (``iq-to``) to other groups only are acknowledged for the group on the way
#: and never leave the server. Held acknowledgements of each group go first. With a
#: record prefix (the Redis index on the same server), each entry's index record is read
#: too. Returns rows [id, how, group number, payload, JSON {"f": other fields, "r":
#: record {v, s, n, r} or false}] for iqbridge entries and [id, how, group number, flat
#: fields] for others (a legacy producer's); how = 1 for a first delivery, 2 for a
#: redelivery.
#:
#: ARGV: consumer, idle ms, requeue consumer, scan limit, record prefix ("" for none),
#: number of groups, then per group: name, count, number of acks, the acks.
_RECEIVE = """
local key = KEYS[1]
local consumer, idle, requeue = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local scan, rp, ngroups = tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6])
local groups, counts = {}, {}
local a = 7
for g = 1, ngroups do
  groups[g], counts[g] = ARGV[a], tonumber(ARGV[a + 1])
  local nacks = tonumber(ARGV[a + 2])
  a = a + 3
  if nacks > 0 then
    redis.call('XACK', key, groups[g], unpack(ARGV, a, a + nacks - 1))
  end
  a = a + nacks
end
local out = {}
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
            local rec = false
            if rp ~= '' then
              rec = redis.call('HMGET', rp .. 'm:' .. id, 'v', 's', 'n', 'r')
            end
            out[#out + 1] = {e[1], how, g, body, cjson.encode({f = meta, r = rec})}
          else
            out[#out + 1] = {e[1], how, g, fields}
          end
          got = got + 1
        else
          redis.call('XACK', key, group, e[1])
        end
      end
    end
  end
  local pending = redis.call('XPENDING', key, group, '-', '+', count, requeue)
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
return out
"""
#: How many entries addressed to other groups one receive passes over at most.
_SCAN = 256
#: Acknowledgements held back at most this many, or this many seconds, then sent.
_ACK_BATCH = 64
_ACK_DELAY = 0.5


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


def decode_fields(stream: str, ref: str, raw: dict[bytes, bytes]) -> tuple[Envelope, bool]:
    """The envelope of a stream entry, and whether it was adopted (no ``iq-id``)."""
    if b"iq-id" not in raw:
        return _adopt(stream, ref, raw), True
    text = {
        k.decode("utf-8", "replace"): v.decode("utf-8", "replace")
        for k, v in raw.items()
        if k != _PAYLOAD
    }
    return _envelope(raw.get(_PAYLOAD, b""), text), False


def _envelope(body: bytes, text: dict[str, str]) -> Envelope:
    """The envelope of an iqbridge entry from its payload and its other fields as text."""
    get = text.get
    try:
        priority = int(get("iq-prio", "4"))
        put_at = int(get("iq-at", "0"))
        parents = tuple(str(p) for p in json.loads(get("iq-parents", "[]")))
    except (ValueError, TypeError):
        priority, put_at, parents = 4, 0, ()
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
        groups=tuple(get("iq-to", "").split()),
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


class RedisStreamsAdapter:
    """Adapter over Redis Streams and consumer groups."""

    capabilities = Capabilities(
        native_groups=True,
        read_by_ref=True,
        retains_after_ack=True,
        native_priority=False,
        max_payload_bytes=_MAX_PAYLOAD,
    )

    def __init__(
        self,
        client: redis.Redis,
        *,
        url: str,
        index_url: str,
        stream_prefix: str = "",
        retry_for: float = 30.0,
        read_ahead: int = 16,
    ) -> None:
        from iqbridge.registry import redact

        self._r = client
        self.url = redact(url)
        self._index_url = index_url
        self.stream_prefix = stream_prefix
        self.retry_for = retry_for
        self._groups: set[tuple[str, str]] = set()
        self._receive = client.register_script(_RECEIVE)
        self._direct = DirectScripts(client)
        self.read_ahead = max(read_ahead, 1)
        self._lock = threading.Lock()
        #: Entries read ahead, per (stream, group, consumer), handed out by later receives.
        self._ahead: dict[tuple[str, str, str], deque[Received]] = {}
        #: Acknowledgements not yet sent, per (stream, group), and when the oldest was made.
        self._acks: dict[tuple[str, str], list[str]] = {}
        self._acks_since = 0.0
        #: When each (stream, *groups) last looked for idle entries (XAUTOCLAIM).
        self._idle_checked: dict[tuple[str, ...], float] = {}

    @classmethod
    def from_url(cls, url: str) -> RedisStreamsAdapter:
        """Connect to the server a ``redis://`` or ``rediss://`` URL names; check it answers."""
        from iqbridge.registry import redact, url_number

        safe = redact(url)
        parts = urlsplit(url)
        if parts.scheme not in ("redis", "rediss"):
            raise ConfigurationError(f"not a Redis URL: {safe!r}; write redis://host:6379/0")
        opts = dict(parse_qsl(parts.query, keep_blank_values=True))
        unknown = set(opts) - _OPTIONS
        if unknown:
            raise ConfigurationError(
                f"unknown Redis Streams option(s) {sorted(unknown)} in {safe}; known: "
                f"{', '.join(sorted(_OPTIONS))}"
            )
        path = parts.path.strip("/")
        if path and not path.isdigit():
            raise ConfigurationError(
                f"Redis URL {safe}: the path must be a database number (/0 to /15), not {path!r}"
            )

        def number(name: str, default: float) -> float:
            return url_number(opts, name, default, url=f"Redis URL {safe}")

        driver_url = urlunsplit(parts._replace(query="", fragment=""))
        index_query = urlencode({k: v for k, v in opts.items() if k in _INDEX_OPTIONS})
        index_url = urlunsplit(parts._replace(query=index_query, fragment=""))
        try:
            client = redis.Redis.from_url(
                driver_url,
                socket_timeout=number("socket_timeout", 10.0),
                socket_connect_timeout=number("socket_connect_timeout", 5.0),
                retry=Retry(NoBackoff(), 0),  # retries are ours (tenacity), with backoff
                # RESP2: redis-py's pure-Python parser reads the scripts' nested replies
                # in about three quarters of the time RESP3's takes.
                protocol=2,
            )
        except (ValueError, TypeError) as exc:
            raise ConfigurationError(f"Redis URL {safe}: {exc}") from exc
        adapter = cls(
            client,
            url=url,
            index_url=index_url,
            stream_prefix=opts.get("stream_prefix", ""),
            retry_for=number("retry_for", 30.0),
            read_ahead=int(number("read_ahead", 16)),
        )
        try:
            adapter._once(client.ping)  # fail fast at start: no long retry
        except BaseException:
            client.close()
            raise
        return adapter

    def default_index(self) -> RedisStore:
        """The Redis index store on the same server and database; it keeps retrying a
        broken connection for ``retry_for`` too, so the hub rides out a restart whole."""
        store = RedisStore.from_url(self._index_url)
        store.retry_for = self.retry_for
        return store

    # --- plumbing ----------------------------------------------------------------------

    def key(self, queue: str) -> str:
        """The stream key of a queue."""
        return f"{self.stream_prefix}{queue}"

    def _unavailable(self, exc: RedisError, tried: str = "") -> IQError:
        if isinstance(exc, AuthenticationError):
            return BrokerUnavailable(
                f"Redis at {self.url} refused the login ({exc}); check the user name and "
                f"password in the broker URL"
            )
        if transient(exc):
            return BrokerUnavailable(
                f"cannot reach Redis at {self.url} ({type(exc).__name__}: {exc}{tried}); "
                f"check that Redis is running there and that the URL's host, port and "
                f"database are right"
            )
        return BrokerUnavailable(
            f"Redis at {self.url} failed a command ({type(exc).__name__}: {exc}); check that "
            f"the server is a writable Redis 6.2 or later primary"
        )

    def _once(self, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except RedisError as exc:
            raise self._unavailable(exc) from exc

    def _call(self, fn: Callable[[], T]) -> T:
        """``fn()``, retried with exponential backoff on a dropped connection or timeout,
        for up to ``retry_for`` seconds (a server restart is ridden out)."""
        try:
            return fn()
        except RedisError as exc:
            if not transient(exc) or self.retry_for <= 0:
                raise self._unavailable(exc) from exc
            log.warning("Redis at %s: %s; reconnecting", self.url, exc)
        retrying = Retrying(
            retry=retry_if_exception(transient),
            stop=stop_after_delay(self.retry_for),
            wait=wait_exponential(multiplier=0.05, max=2.0) + wait_random(0, 0.05),
            before_sleep=before_sleep_log(log, logging.WARNING),
            reraise=True,
        )
        try:
            return retrying(fn)
        except RedisError as exc:
            raise self._unavailable(exc, f"; retried for {self.retry_for:g} s") from exc

    def _ensure_group(self, key: str, group: str) -> None:
        if (key, group) in self._groups:
            return

        def create() -> None:
            try:
                self._r.xgroup_create(key, group, id="0", mkstream=True)
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

        self._call(create)
        self._groups.add((key, group))

    # --- the Adapter protocol ----------------------------------------------------------

    def declare(self, queue: str, groups: Sequence[str]) -> None:
        """Create the consumer groups (at id 0, creating the stream) if missing."""
        key = self.key(queue)
        for group in groups:
            self._ensure_group(key, group)

    def send(self, queue: str, envelopes: Sequence[Envelope]) -> list[str]:
        """``XADD`` each envelope, in order, in one round trip; return the entry ids.

        A retry after a lost reply may add an entry twice; the facade acknowledges the
        second entry of a message it already delivers (once-only) instead of delivering it.
        """
        key = self.key(queue)

        def add() -> list[Any]:
            pipe = self._r.pipeline(transaction=False)
            for env in envelopes:
                pipe.xadd(key, encode_fields(env))  # type: ignore[arg-type]
            return pipe.execute()

        return [_text(ref) for ref in self._call(add)]

    def receive(
        self,
        queue: str,
        group: str,
        consumer: str,
        *,
        count: int,
        timeout: float,
        min_idle: float | None = None,
    ) -> list[Received]:
        """Requeued entries first, then idle ones (with ``min_idle``), then new ones."""
        out = self._receive_groups(queue, [group], consumer, count, min_idle, "")
        if not out and timeout > 0:
            key = self.key(queue)
            block = max(int(timeout * 1000), 1)
            reply: Any = self._call(
                lambda: self._r.xreadgroup(group, consumer, {key: ">"}, count=count, block=block)
            )
            for _stream, entries in reply or []:
                for ref, fields in entries:
                    if fields is not None:
                        env, adopted = decode_fields(key, _text(ref), fields)
                        if env.groups and group not in env.groups:
                            self.ack(queue, group, [_text(ref)])
                            continue
                        out.append(Received(_text(ref), group, env, adopted=adopted))
        return out

    def _receive_groups(
        self,
        queue: str,
        groups: Sequence[str],
        consumer: str,
        count: int,
        min_idle: float | None,
        record_prefix: str,
    ) -> list[Received]:
        """Entries read ahead first (the first group in order with any); if they are
        fewer than ``count``, one script call over the groups in order until one has
        entries for the rest; what it read beyond ``count`` is read ahead."""
        key = self.key(queue)
        for group in groups:
            self._ensure_group(key, group)
        head: list[Received] = []
        with self._lock:
            for group in groups:
                ahead = self._ahead.get((key, group, consumer))
                if ahead:
                    head = [ahead.popleft() for _ in range(min(count, len(ahead)))]
                    break
            if len(head) >= count:
                return head
            acks = {g: self._acks.pop((key, g), []) for g in groups}
        count -= len(head)
        idle_ms = 0
        if min_idle is not None:
            # XAUTOCLAIM walks the group's pending entries from the start: not on every
            # receive, but often enough that an entry idle for min_idle waits at most
            # half as long again (and at most a second) before it is taken over.
            now = time.monotonic()
            slot = (key, *groups)
            if now - self._idle_checked.get(slot, -math.inf) >= min(min_idle / 2, 1.0):
                self._idle_checked[slot] = now
                idle_ms = max(int(min_idle * 1000), 1)
        args: list[Any] = [consumer, idle_ms, REQUEUE_CONSUMER, _SCAN, record_prefix, len(groups)]
        want = max(count, self.read_ahead)
        for group in groups:
            # Also in a pool's group: the facade offers a member's read-ahead entries to
            # the other members through the index (Queue._claim_read_ahead).
            args += [group, want, len(acks[group]), *acks[group]]
        try:
            rows: Any = self._call(lambda: self._direct.run(self._receive, [key], args))
        except BaseException:
            for group, refs in acks.items():
                if refs:
                    self._hold_acks(key, group, refs)
            raise
        got = [r for r in (self._row(key, groups, row) for row in rows) if r is not None]
        if len(got) > count:
            with self._lock:
                slot = (key, got[0].group, consumer)
                self._ahead.setdefault(slot, deque()).extend(got[count:])
        return head + got[:count]

    def _row(self, key: str, groups: Sequence[str], row: Sequence[Any]) -> Received | None:
        """One row of the receive script as a :class:`Received` (None: the entry is gone)."""
        ref, group = _text(row[0]), groups[int(row[2]) - 1]
        how = int(row[1])
        if len(row) == 4:  # not an iqbridge entry: every field as it is
            env, adopted = decode_fields(key, ref, _pairs(row[3]))
            return Received(ref, group, env, adopted, delivery_count=how)
        try:
            # Bytes that are not UTF-8 in a field become U+FFFD, as decode_fields does.
            meta = orjson.loads(bytes(row[4]).decode("utf-8", "replace"))
            text: dict[str, str] = meta["f"]
            env = _envelope(bytes(row[3]), text)
        except (ValueError, TypeError, KeyError):
            # Not the JSON the script writes (should not happen): read the entry as it is.
            found: Any = self._call(lambda: self._r.xrange(key, ref, ref))
            if not found:
                return None  # deleted meanwhile (a purge): nothing left to deliver
            env, adopted = decode_fields(key, ref, found[0][1])
            return Received(ref, group, env, adopted, delivery_count=how)
        rec = meta.get("r")
        record = _record(env.msg_id, rec) if rec else None
        return Received(ref, group, env, delivery_count=how, record=record)

    # --- one round trip with the Redis index on the same server (Colocated) -----------

    def colocated(self, store: object) -> bool:
        """True when ``store`` is a Redis index on this adapter's server and database."""
        return isinstance(store, RedisStore) and _server(store.client) == _server(self._r)

    def send_indexed(
        self, queue: str, envelopes: Sequence[Envelope], changes: Sequence[Change], store: object
    ) -> list[str]:
        """Commit the new records and ``XADD`` their entries in one script call, all or
        nothing (see :meth:`RedisStore.commit_with_entries`); return the entry ids."""
        assert isinstance(store, RedisStore)
        entries = [
            [part for item in encode_fields(env).items() for part in item] for env in envelopes
        ]
        return store.commit_with_entries(changes, self.key(queue), entries)

    def receive_indexed(
        self,
        queue: str,
        groups: Sequence[str],
        consumer: str,
        *,
        count: int,
        min_idle: float | None,
        store: object,
    ) -> list[Received]:
        """:meth:`receive` over several groups in order until one has entries, in one
        round trip that also reads each entry's index record (a hint, see
        :attr:`Received.record`)."""
        assert isinstance(store, RedisStore)
        return self._receive_groups(queue, groups, consumer, count, min_idle, store.keyspace)

    def ack(self, queue: str, group: str, refs: Sequence[str]) -> None:
        """``XACK``, batched: sent with the group's next receive, or once 64 are held or
        half a second has passed, or at :meth:`flush` and :meth:`close`.

        The index already holds each outcome, so an acknowledgement lost with a crashed
        process only means a redelivery, which the facade recognises and acknowledges.
        """
        if refs:
            self._hold_acks(self.key(queue), group, refs)

    def _hold_acks(self, key: str, group: str, refs: Sequence[str]) -> None:
        now = time.monotonic()
        with self._lock:
            if not any(self._acks.values()):
                self._acks_since = now
            held = self._acks.setdefault((key, group), [])
            held.extend(refs)
            due = len(held) >= _ACK_BATCH or now - self._acks_since >= _ACK_DELAY
        if due:
            self.flush()

    def _send_acks(self, key: str, group: str, refs: Sequence[str]) -> None:
        try:
            self._call(lambda: self._r.xack(key, group, *refs))
        except BaseException:
            with self._lock:
                self._acks.setdefault((key, group), []).extend(refs)
            raise

    def flush(self) -> None:
        """Send every held acknowledgement now."""
        with self._lock:
            acks, self._acks = self._acks, {}
            self._acks_since = time.monotonic()
        for (key, group), refs in acks.items():
            if refs:
                self._send_acks(key, group, refs)

    def requeue(self, queue: str, group: str, ref: str) -> None:
        """Hand a pending entry to the reserved requeue consumer; the next receive of the
        group takes it first. An entry no longer pending is left alone."""
        key = self.key(queue)
        self._call(lambda: self._r.xclaim(key, group, REQUEUE_CONSUMER, 0, [ref], justid=True))

    def redeliver(self, queue: str, group: str, ref: str) -> bool:
        """Make the group deliver an entry again even if it was acknowledged (``XCLAIM
        FORCE``): what a consumer crash before its ack looks like. For tests and repair."""
        key = self.key(queue)
        self._call(
            lambda: self._r.xclaim(key, group, REQUEUE_CONSUMER, 0, [ref], force=True, justid=True)
        )
        return True

    def dead_letter(self, queue: str, group: str, ref: str, reason: str) -> None:
        """``XACK`` and ``XADD`` to ``<stream>:dead`` with the reason, in one ``MULTI``."""
        key = self.key(queue)

        def park() -> None:
            pipe = self._r.pipeline(transaction=True)
            pipe.xadd(f"{key}:dead", {"ref": ref, "group": group, "reason": reason})
            pipe.xack(key, group, ref)
            pipe.execute()

        self._call(park)

    def dead_letters(self, queue: str, count: int = 100) -> list[dict[str, str]]:
        """The latest entries of the queue's dead-letter stream (for admin and tests)."""
        key = f"{self.key(queue)}:dead"
        rows: Any = self._call(lambda: self._r.xrevrange(key, count=count))
        return [
            {_text(k): _text(v) for k, v in fields.items()} | {"id": _text(ref)}
            for ref, fields in rows
        ]

    def read(self, queue: str, ref: str) -> Envelope | None:
        """The envelope of one entry (``XRANGE ref ref``), or None if it was deleted."""
        key = self.key(queue)
        rows: Any = self._call(lambda: self._r.xrange(key, ref, ref))
        if not rows:
            return None
        return decode_fields(key, ref, rows[0][1])[0]

    def read_many(self, queue: str, refs: Sequence[str]) -> list[Envelope | None]:
        """The envelopes of several entries (one ``XRANGE ref ref`` each, pipelined in
        one round trip), in order; None for an entry that was deleted."""
        if not refs:
            return []
        key = self.key(queue)

        def fetch() -> Any:
            pipe = self._r.pipeline(transaction=False)
            for ref in refs:
                pipe.xrange(key, ref, ref)
            return pipe.execute()

        replies: Any = self._call(fetch)
        return [
            decode_fields(key, ref, rows[0][1])[0] if rows else None
            for ref, rows in zip(refs, replies, strict=True)
        ]

    def take_over(self, queue: str, group: str) -> int:
        """Every pending entry of ``group`` to the requeue consumer (``TakesOver``)."""
        return redis_take_over(self._call, self._r, self.key(queue), group, REQUEUE_CONSUMER)

    def find_sent(self, queue: str, sent: Sequence[tuple[str, int]]) -> dict[str, str]:
        """Entries of ``sent`` the stream holds (``Probing``): read from the put on."""
        return redis_find_sent(self._call, self._r, self.key(queue), sent) if sent else {}

    def delete(self, queue: str, refs: Sequence[str]) -> None:
        """``XDEL`` entries (purge of journalled messages)."""
        if refs:
            key = self.key(queue)
            self._call(lambda: self._r.xdel(key, *refs))

    def pending(self, queue: str, group: str) -> dict[str, str]:
        """Pending entries of a group: entry id -> consumer (for tests and admin)."""
        key = self.key(queue)
        rows = self._call(
            lambda: self._r.xpending_range(key, group, min="-", max="+", count=10_000)
        )
        return {_text(p["message_id"]): _text(p["consumer"]) for p in rows}

    def entries(self, queue: str) -> Iterator[Entry]:
        """Every entry of the queue's stream (``Inventory``)."""
        return redis_entries(self._call, self._r, self.key(queue))

    def unacked(self, queue: str, group: str) -> Unacked:
        """The group's PEL and unread entries (``Inventory``), held acks sent first."""
        self.flush()
        return redis_unacked(self._call, self._r, self.key(queue), group)

    def close(self) -> None:
        """Send held acknowledgements, give entries read ahead back to their groups (they
        would otherwise wait out ``min_idle``), and release the connection pool."""
        try:
            with self._lock:
                ahead: dict[tuple[str, str, str], list[Any]] = {
                    slot: [r.native_ref for r in q] for slot, q in self._ahead.items() if q
                }
                self._ahead.clear()
            for (key, group, _consumer), refs in ahead.items():
                give_back = functools.partial(
                    self._r.xclaim, key, group, REQUEUE_CONSUMER, 0, refs, justid=True
                )
                self._call(give_back)
            self.flush()
        except IQError as exc:
            log.warning("Redis at %s: closed with work not sent: %s", self.url, exc)
        finally:
            self._r.close()

    def __repr__(self) -> str:
        return f"<RedisStreamsAdapter {self.url}>"


def _pairs(flat: Sequence[Any]) -> dict[bytes, bytes]:
    """A Lua script's flat [field, value, ...] reply as a dict."""
    return {bytes(flat[i]): bytes(flat[i + 1]) for i in range(0, len(flat), 2)}


def _server(client: redis.Redis) -> tuple[object, ...]:
    """Where a client connects: host, port, unix socket path and database."""
    kw = client.connection_pool.connection_kwargs
    return (kw.get("host"), kw.get("port"), kw.get("path"), int(kw.get("db") or 0))


def _record(msg_id: str, flat: Sequence[Any]) -> MessageRecord | None:
    """An index record read by the receive script ([v, s, n, r], JSON false for a field
    that is missing), or None if it has none."""
    v, seq, native, body = flat
    if not v or not body:
        return None
    return record_from_json(msg_id, body, version=int(v), seq=int(seq), native_ref=native or None)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
