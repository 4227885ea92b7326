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
the index; a get whose read claims on the way, with the Redis index on the same server,
reads only what it asks for),
``socket_timeout`` and ``socket_connect_timeout`` (seconds, default 10 and 5). Its default
index is the Redis index store on the same server and database; it retries for
``retry_for`` too.
"""

from __future__ import annotations

import functools
import itertools
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

from iqbridge.adapter import Capabilities, ClaimOnReceive
from iqbridge.engine import Change
from iqbridge.engine_batch import SettlePlan
from iqbridge.errors import BrokerUnavailable, ConfigurationError, IQError
from iqbridge.ids import new_token
from iqbridge.inventory import Entry, Unacked
from iqbridge.model import Envelope, Received
from iqbridge.redaction import get_logger
from iqbridge.stores.redis import DirectScripts, RedisStore, transient
from iqbridge.writes import Writes

from .probes import redis_find_sent, redis_take_over  # noqa: TID251
from .redis_inventory import redis_dead_letters, redis_entries, redis_unacked  # noqa: TID251
from .redis_wire import (  # noqa: TID251
    OWN_FIELDS,
    RECEIVE_SCRIPT,
    claim_args,
    decode_fields,
    encode_fields,
    envelope_of,
    kind_fields,
    pairs,
    record_of,
)

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

#: How many entries addressed to other groups one receive passes over at most.
_SCAN = 256
#: Acknowledgements held back at most this many, or this many seconds, then sent.
_ACK_BATCH = 64
#: Claims one receive makes at most (two journal entries each, in one journal row).
_CLAIM_LIMIT = 30_000
_ACK_DELAY = 0.5


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
        self._receive = client.register_script(RECEIVE_SCRIPT)
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
        #: The last entry id handed to each (stream, group, consumer), and the slots a
        #: read of which lost its reply (see _marking_lost).
        self._seen: dict[tuple[str, str, str], str] = {}
        self._lost: set[tuple[str, str, str]] = set()
        #: Claims on receive (see _claim_args): their tokens' prefix, and call numbers.
        self._token_prefix = new_token()[:16]
        self._calls = itertools.count(1)

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

        A connection lost on the way leaves the entries in doubt: Redis may have added
        some of them (the first ones: it runs the pipeline in order) before the reply was
        lost. The retry first reads the stream from the put's time on (``find_sent``, by
        ``iq-id``) and adds only the entries it lacks, in order, so the stream holds one
        entry per message.
        """
        key = self.key(queue)
        refs: dict[str, str] = {}
        tried = False

        def add() -> list[str]:
            nonlocal tried
            todo = list(envelopes)
            if tried:
                lost = [(env.msg_id, env.put_at) for env in todo if env.msg_id not in refs]
                if lost:
                    found = redis_find_sent(_now, self._r, key, lost)
                    if found:
                        log.info(
                            "Redis at %s: %d of %d entries in doubt after a lost connection "
                            "were added; adding the rest",
                            self.url,
                            len(found),
                            len(lost),
                        )
                    refs.update(found)
                todo = [env for env in todo if env.msg_id not in refs]
            tried = True
            if todo:
                pipe = self._r.pipeline(transaction=False)
                for env in todo:
                    pipe.xadd(key, encode_fields(env))  # type: ignore[arg-type]
                for env, ref in zip(todo, pipe.execute(), strict=True):
                    refs[env.msg_id] = _text(ref)
            return [refs[env.msg_id] for env in envelopes]

        return self._call(add)

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
        """Requeued entries first, then idle ones (with ``min_idle``), then new ones.

        A read whose reply a lost connection took may have moved entries to this
        consumer's pending list: the next read (the retry, or the next receive) hands
        those out first, in id order, before anything newer of the group."""
        out = self._receive_groups(queue, [group], consumer, count, min_idle, "")
        if not out and timeout > 0:
            key = self.key(queue)
            slot = (key, group, consumer)
            block = max(int(timeout * 1000), 1)

            def read() -> Any:
                with self._lock:
                    after = self._reread_from(slot)
                if after:
                    # The lost read's entries, which wait for no one: no blocking.
                    again: Any = self._r.xreadgroup(group, consumer, {key: after}, count=count)
                    entries = again[0][1] if again else []
                    if len(entries) < count:
                        with self._lock:
                            self._lost.discard(slot)
                    if entries:
                        return again
                new = functools.partial(
                    self._r.xreadgroup, group, consumer, {key: ">"}, count=count, block=block
                )
                return self._marking_lost([slot], new)

            reply: Any = self._call(read)
            for _stream, entries in reply or []:
                for ref, fields in entries:
                    if fields is not None:
                        env, adopted = decode_fields(key, _text(ref), fields)
                        if env.groups and group not in env.groups:
                            self.ack(queue, group, [_text(ref)])
                            continue
                        out.append(Received(_text(ref), group, env, adopted=adopted))
            self._saw(key, consumer, out)
        return out

    def _reread_from(self, slot: tuple[str, str, str]) -> str:
        """Where to read a consumer's own pending entries again from (after the last
        entry this process handed it), or "" when no read of it was lost (under the
        lock)."""
        if slot not in self._lost:
            return ""
        return self._seen.get(slot, "0-0")

    def _marking_lost(self, slots: Sequence[tuple[str, str, str]], fn: Callable[[], T]) -> T:
        """``fn()``, a read for these (stream, group, consumer) slots; a dropped
        connection or a timeout may have lost its reply after Redis moved entries to the
        consumer's pending list, so the next read of each slot reads those again first."""
        try:
            return fn()
        except RedisError as exc:
            if transient(exc):
                with self._lock:
                    self._lost.update(slots)
            raise

    def _saw(self, key: str, consumer: str, received: Sequence[Received]) -> None:
        """Remember the last entry id handed to each (group, consumer)."""
        with self._lock:
            for r in received:
                slot = (key, r.group, consumer)
                last = self._seen.get(slot)
                if last is None or _id_key(r.native_ref) > _id_key(last):
                    self._seen[slot] = r.native_ref

    def _receive_groups(
        self,
        queue: str,
        groups: Sequence[str],
        consumer: str,
        count: int,
        min_idle: float | None,
        record_prefix: str,
        claim: ClaimOnReceive | None = None,
    ) -> list[Received]:
        """Entries read ahead first (the first group in order with any); if they are
        fewer than ``count``, one script call over the groups in order until one has
        entries for the rest; what it read beyond ``count`` is read ahead."""
        key = self.key(queue)
        if claim is not None:
            claim.tokens.clear()  # this call's claims only
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
        slots = [(key, group, consumer) for group in groups]
        claiming: list[Any] = []
        # Entries read ahead are claimed by the client, so this read's entries (later
        # ones) are too, in the same commit: claimed apart, a client killed between the
        # two commits would leave later messages claimed and earlier ones not.
        if claim is not None and record_prefix and not head:
            claiming = self._claim_args(queue, record_prefix, claim, count)
        # A read that claims on the way reads no more than it may claim: an entry read
        # ahead would cost its own claim later (a round trip through the index's full
        # write path) where reading it then costs one round trip that claims it too, and
        # meanwhile it would wait in this consumer, out of its pool's reach.
        want = count if claiming else max(count, self.read_ahead)

        def read() -> Any:
            args: list[Any] = [consumer, idle_ms, REQUEUE_CONSUMER, _SCAN, record_prefix]
            args.append(len(groups))
            with self._lock:
                afters = [self._reread_from(slot) for slot in slots]
            for group, after in zip(groups, afters, strict=True):
                # Also in a pool's group: the facade offers a member's read-ahead entries
                # to the other members through the index (Queue._claim_read_ahead).
                args += [group, want, after, len(acks[group]), *acks[group]]
            args += claiming
            return self._marking_lost(slots, lambda: self._direct.run(self._receive, [key], args))

        try:
            rows, reread = self._call(read)
        except BaseException:
            for group, refs in acks.items():
                if refs:
                    self._hold_acks(key, group, refs)
            raise
        with self._lock:
            for number in reread:
                self._lost.discard(slots[int(number) - 1])
        tokens = claim.tokens if claim is not None else None
        got = [r for r in (self._row(key, groups, row, tokens) for row in rows) if r is not None]
        self._saw(key, consumer, got)
        if len(got) > count:
            with self._lock:
                slot = (key, got[0].group, consumer)
                self._ahead.setdefault(slot, deque()).extend(got[count:])
        return head + got[:count]

    def _claim_args(self, queue: str, prefix: str, claim: ClaimOnReceive, count: int) -> list[Any]:
        """The receive script's values for a claim on receive (made now). Its tokens
        start with this adapter's prefix, then the call's number: a read whose reply is
        lost is retried with the same values, and knows its claims again."""
        token = f"{self._token_prefix}{next(self._calls):08x}"
        return claim_args(queue, prefix, claim, min(count, _CLAIM_LIMIT), token, self._token_prefix)

    def _row(
        self,
        key: str,
        groups: Sequence[str],
        row: Sequence[Any],
        tokens: dict[str, str] | None = None,
    ) -> Received | None:
        """One row of the receive script as a :class:`Received` (None: the entry is gone);
        a claim's token goes to ``tokens``."""
        ref, group = _text(row[0]), groups[int(row[2]) - 1]
        how = int(row[1])
        if how == 3:  # read again after a lost reply: the application never saw it
            how = 1
        if len(row) == 4:  # not an iqbridge entry: every field as it is
            env, adopted = decode_fields(key, ref, pairs(row[3]))
            return Received(ref, group, env, adopted, delivery_count=how)
        try:
            # Bytes that are not UTF-8 in a field become U+FFFD, as decode_fields does.
            meta = orjson.loads(bytes(row[4]).decode("utf-8", "replace"))
            text: dict[str, str] = meta["f"]
            env = envelope_of(bytes(row[3]), text)
        except (ValueError, TypeError, KeyError):
            # Not the JSON the script writes (should not happen): read the entry as it is.
            found: Any = self._call(lambda: self._r.xrange(key, ref, ref))
            if not found:
                return None  # deleted meanwhile (a purge): nothing left to deliver
            env, adopted = decode_fields(key, ref, found[0][1])
            return Received(ref, group, env, adopted, delivery_count=how)
        rec = meta.get("r")
        token = meta.get("t")
        if token and tokens is not None and rec and "a" in meta:
            # Claimed on the way: its record is made only if a move needs it.
            tokens[ref] = token
            read = functools.partial(record_of, env.msg_id, rec)
            claimed = (int(meta["a"]), int(meta["ma"]), read)
            return Received(ref, group, env, delivery_count=how, claimed=claimed)
        record = record_of(env.msg_id, rec) if rec else None
        if token and tokens is not None and record is not None:
            tokens[ref] = token
        return Received(ref, group, env, delivery_count=how, record=record)

    # --- one round trip with the Redis index on the same server (Colocated) -----------

    def colocated(self, store: object) -> bool:
        """True when ``store`` is a Redis index on this adapter's server and database."""
        return isinstance(store, RedisStore) and _server(store.client) == _server(self._r)

    def send_indexed(
        self,
        queue: str,
        envelopes: Sequence[Envelope],
        changes: Sequence[Change] | Writes,
        store: object,
    ) -> list[str]:
        """Commit the new records and ``XADD`` their entries in one script call, all or
        nothing (:meth:`RedisStore.commit_with_entries`; for a batch's Writes, by kinds
        :meth:`RedisStore.put_with_entries`); return the entry ids."""
        assert isinstance(store, RedisStore)
        stream = self.key(queue)
        if isinstance(changes, Writes) and changes.kinds and not changes.retain:
            shared = kind_fields(envelopes, changes.kinds)  # alike messages share these
            bodies = [env.body for env in envelopes]
            return store.put_with_entries(changes, stream, OWN_FIELDS, shared, bodies)
        entries = [[part for item in encode_fields(e).items() for part in item] for e in envelopes]
        if isinstance(changes, Writes):
            return store.commit_writes_with_entries(changes, stream, entries)
        return store.commit_with_entries(changes, stream, entries)

    def receive_indexed(
        self,
        queue: str,
        groups: Sequence[str],
        consumer: str,
        *,
        count: int,
        min_idle: float | None,
        store: object,
        claim: ClaimOnReceive | None = None,
    ) -> list[Received]:
        """:meth:`receive` over several groups in order until one has entries, in one
        round trip that also reads each entry's index record (a hint, see
        :attr:`Received.record`) and, with ``claim``, claims the entries of the
        subscriber's own group on the common path in the same script (see
        :data:`~iqbridge.adapters.redis_wire.RECEIVE_SCRIPT`)."""
        assert isinstance(store, RedisStore)
        return self._receive_groups(queue, groups, consumer, count, min_idle, store.keyspace, claim)

    def settle_indexed(
        self,
        queue: str,
        writes: Writes,
        acks: Sequence[tuple[int, str, str]],
        store: object,
    ) -> list[bool]:
        """Commit a batch's settles and ``XACK`` the entries of those that hold, in one
        script call (see :meth:`RedisStore.commit_writes_acking`): an outcome and its
        acknowledgement are made together. One flag per record, as
        :meth:`~iqbridge.stores.base.IndexStore.commit_writes` returns them."""
        assert isinstance(store, RedisStore)
        if not acks:
            return store.commit_writes(writes)
        return store.commit_writes_acking(writes, self.key(queue), acks)

    def settle_held(
        self,
        queue: str,
        plan: SettlePlan,
        at: int,
        held: Sequence[tuple[str, str, str, str]],
        store: object,
    ) -> list[bool]:
        """Settle where the index lives, ``XACK`` included
        (:meth:`RedisStore.settle_held_acking`)."""
        assert isinstance(store, RedisStore)
        return store.settle_held_acking(queue, self.key(queue), plan, at, held)

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
        return redis_dead_letters(self._call, self._r, f"{self.key(queue)}:dead", count)

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


def _server(client: redis.Redis) -> tuple[object, ...]:
    """Where a client connects: host, port, unix socket path and database."""
    kw = client.connection_pool.connection_kwargs
    return (kw.get("host"), kw.get("port"), kw.get("path"), int(kw.get("db") or 0))


def _id_key(ref: str) -> tuple[int, int]:
    """A stream entry id as a sortable pair."""
    ms, _, seq = ref.partition("-")
    return int(ms), int(seq or 0)


def _now(fn: Callable[[], T]) -> T:
    """``fn()`` as it is: inside a retried call, a failure is the call's to retry."""
    return fn()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
