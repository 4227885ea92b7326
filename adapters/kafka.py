"""Kafka: ``kafka://host:port[,host:port...][?options]`` through confluent-kafka (librdkafka).

Native mapping (see docs/adapters/kafka.md):

* an iqbridge queue is a topic ``<prefix><queue>`` (created on first use with
  ``partitions`` partitions); each subscriber and each pool is a consumer group
  ``<prefix><queue>.<group>`` (pool members share their pool's group and split its
  partitions); a new group starts at the earliest offset, so it sees earlier records;
* a put is one record per message, produced by an idempotent producer (``acks=all``)
  and waited for (delivery reports); the ordering key is the record key, so a key stays
  in one partition and in order; the native reference is ``<partition>:<offset>``; a
  plain put produces first and then commits the index records with their references in
  one commit (``Capabilities.index_after_send``: a get that reads a record before its
  index record exists gives it back, a put in flight); an idempotent put (with msg_ids)
  commits its records first, as its repeat needs them;
* a group's consumer reads records ahead into this process; records addressed to other
  groups are settled as they pass. DONE, UNUSABLE (the record is copied to the topic
  ``<prefix><queue>.iq-dead`` with the reason) and EXPIRED settle a record; a partition's
  committed offset is the lowest offset not settled (one commit per batch), never past a
  record in doubt; after a restart or a rebalance the records from there are read again
  and the index skips those finished (once-only);
* a record given back is handed out again from memory, the partition is never rewound;
  an ordering key is fenced across the consumers of a process (see
  :mod:`iqbridge.adapters.kafka_feed`); partitions taken away in a rebalance are
  committed after a bounded wait for the records this process is still processing;
* Kafka cannot delete a record or read one back cheaply: ``read_by_ref=False`` and
  ``retains_after_ack=False`` (retention is a time), so the facade keeps a retained copy
  of each payload beside the index for journalled retention, peek, browse and
  redelivery; withdraw and undo of a put happen in the index.

Wire format: the value is the payload, unchanged; the envelope travels in headers
(``iq-id``, ``iq-at``, ``iq-pub``, ``iq-prio``, ``iq-ct``, ``iq-corr``, ``iq-parents``,
``iq-to``, ``iq-exp``); the application's headers as they are (one named ``iq-...``
travels as ``iq-h-<name>``). A record without ``iq-id`` (a plain producer's) is adopted
under a msg_id derived from topic, partition and offset (see
:mod:`iqbridge.adapters.kafka_wire`).

Options: ``prefix`` (prepended to topic and group names, default none), ``partitions``
(of topics this adapter creates, default 1), ``replication`` (their replication factor,
default 1), ``retry_for`` (seconds: how long a put waits for the broker before it fails,
how long a consumer may go without reaching it before gets fail; default 30),
``connect_timeout`` (seconds to reach the broker at start, default 10),
``join_timeout`` (seconds a get waits past its own timeout at most, and only for records
this process produced that the subscriber's groups have not read yet: a consumer joining
its group, the first fetch; default 5; a longer join goes on in the background),
``buffer`` (records a group's consumer holds read ahead and unsettled at most, default
20000: past it the partitions are paused, and librdkafka fetches a resumed partition
only up to a second later, so keep it well above a batch),
``revoke_wait`` (seconds a rebalance waits for records in process, default 10); and every
librdkafka property (a name with a dot: ``security.protocol``, ``sasl.mechanism``,
``ssl.ca.location``, ``session.timeout.ms``, ...), passed through to the producer and the
consumers. ``kafka://user:password@host:port`` sets ``sasl.username`` and
``sasl.password`` (with ``sasl.mechanism=PLAIN`` and ``security.protocol=SASL_PLAINTEXT``
unless given). librdkafka's log lines go to the Python logger ``iqbridge.librdkafka``
(a failed connection, repeated many times a second, at INFO once per client, then DEBUG:
see :mod:`iqbridge.adapters.kafka_clients`). The default index is the SQLite file
``iqbridge-index.db`` in the working directory.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from iqbridge.adapter import Capabilities
from iqbridge.errors import BrokerRefused, BrokerUnavailable, ConfigurationError, InvalidArgument
from iqbridge.inventory import Entry, Unacked
from iqbridge.model import Envelope, Received
from iqbridge.redaction import get_logger, redact, scrub, url_secrets
from iqbridge.stores.sqlite import SqliteStore

from .kafka_clients import PROBE, RdLog, client_config  # noqa: TID251
from .kafka_feed import Feed, FeedFailed  # noqa: TID251
from .kafka_inventory import kafka_entries, kafka_unacked  # noqa: TID251
from .kafka_url import parse_url  # noqa: TID251
from .kafka_wire import Header, encode, header_items, header_text, parse_ref, ref  # noqa: TID251
from .probes import kafka_find_sent  # noqa: TID251

__all__ = ["KafkaAdapter"]

#: Records to produce (key, headers, value); find_sent; the envelopes of the records.
Items = Sequence[tuple[bytes | None, list[Header], bytes]]
Probe = Callable[[list[tuple[str, int]]], dict[str, str]] | None
Envs = Sequence[Envelope]

log = get_logger("iqbridge.adapters.kafka")

#: Legal topic names (Kafka's rule).
_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
#: librdkafka's default message.max.bytes; the envelope's headers need room too.
_MAX_MESSAGE = 1_000_000
_HEADROOM = 32 * 1024
#: The longest slice of one blocking librdkafka call made from a caller's thread: a
#: KeyboardInterrupt (Ctrl-C) is raised between two slices.
_SLICE = 1.0
#: Errors that mean the broker cannot be reached at all (not one dropped connection).
_DOWN = frozenset(
    {
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._RESOLVE,
        KafkaError._AUTHENTICATION,
        KafkaError._SSL,
    }
)


class _Fatal(Exception):
    """librdkafka declared the producer unusable (a fatal error): replace it."""


#: What this process produced: (bootstrap servers, topic) -> partition -> (highest
#: offset, when it was produced: monotonic seconds).
#: A first get waits until its group's consumer has read that far (shared by every
#: adapter in the process, so a put through one hub is seen by a get through another).
_SENT: dict[tuple[str, str], dict[int, tuple[int, float]]] = {}
_SENT_LOCK = threading.Lock()


class KafkaAdapter:
    """Adapter over Kafka (any Kafka-wire broker) through confluent-kafka."""

    def __init__(
        self,
        config: dict[str, Any],
        *,
        url: str,
        prefix: str = "",
        partitions: int = 1,
        replication: int = 1,
        retry_for: float = 30.0,
        connect_timeout: float = 10.0,
        join_timeout: float = 5.0,
        buffer: int = 20000,
        revoke_wait: float = 10.0,
    ) -> None:
        self.url = redact(url)
        #: What librdkafka's messages must not show (it may quote a property's value).
        self._secrets = url_secrets(url)
        self.prefix = prefix
        self.partitions = partitions
        self.replication = replication
        self.retry_for = retry_for
        self.connect_timeout = connect_timeout
        self.join_timeout = join_timeout
        self.buffer = buffer
        self.revoke_wait = revoke_wait
        self._config = dict(config)
        self._config.setdefault("statistics.interval.ms", 1000)
        self._config["logger"] = RdLog()
        self._config["error_cb"] = self._on_error
        self._config["stats_cb"] = self._on_stats
        self._servers = str(config["bootstrap.servers"])
        max_message = int(config.get("message.max.bytes", _MAX_MESSAGE))
        self.capabilities = Capabilities(
            native_groups=True,
            read_by_ref=False,
            retains_after_ack=False,
            native_priority=False,
            max_payload_bytes=max(max_message - _HEADROOM, 1024),
            # One consumer per partition at a time: the facade never claims records
            # another process read ahead (each key keeps its order).
            single_active_groups=True,
            # A put produces first, then commits its records with their references in
            # one index commit; a record read before its record exists is given back.
            index_after_send=True,
        )
        self._lock = threading.RLock()
        self._producer: Producer | None = None
        self._admin: AdminClient | None = None
        self._feeds: dict[tuple[str, str], Feed] = {}
        #: (queue, consumer) -> until when its gets may wait past their timeout (monotonic
        #: seconds): one join_timeout for the reads of all the groups of one get.
        self._grace: dict[tuple[str, str], float] = {}
        self._grace_lock = threading.Lock()
        self._topics: set[str] = set()
        self._down_since: float | None = None
        self._down_why = ""
        #: connect() is checking that the brokers answer: it reports an outage itself.
        self._checking = False
        self._closed = False

    @classmethod
    def from_url(cls, url: str) -> KafkaAdapter:
        """Connect to the brokers a ``kafka://`` URL names; check that they answer."""
        config, options = parse_url(url)
        adapter = cls(config, url=url, **options)
        adapter._check()
        return adapter

    def default_index(self) -> SqliteStore:
        """The SQLite index file ``iqbridge-index.db`` in the working directory: right
        for processes on one host; pass ``index=`` (Redis, PostgreSQL, ...) for more."""
        return SqliteStore.from_url("sqlite:///iqbridge-index.db")

    # --- names ---------------------------------------------------------------------

    def topic(self, queue: str) -> str:
        """The topic of an iqbridge queue (Kafka allows letters, digits, ``.``, ``_``
        and ``-`` only)."""
        name = f"{self.prefix}{queue}"
        if not _TOPIC.match(name):
            raise InvalidArgument(
                f"queue {queue!r} cannot be a Kafka topic ({name!r}): Kafka topic names "
                f"hold letters, digits, '.', '_' and '-' only, 249 at most; rename the "
                f"queue or the prefix"
            )
        return name

    def group_id(self, queue: str, group: str) -> str:
        """The consumer group of a subscriber or pool."""
        return f"{self.prefix}{queue}.{group}"

    def dead_topic(self, queue: str) -> str:
        """The topic UNUSABLE records are copied to, with their reason."""
        return f"{self.topic(queue)}.iq-dead"

    # --- clients -------------------------------------------------------------------

    def _client_config(self, kind: str = "", **extra: Any) -> dict[str, Any]:
        """The librdkafka configuration of a client (see :func:`client_config`)."""
        return client_config(self._config, kind, **extra)

    def _unavailable(self, what: str) -> BrokerUnavailable:
        return BrokerUnavailable(
            f"cannot reach Kafka at {self.url} ({scrub(what, self._secrets)}); check that the "
            f"broker runs there and that the URL's hosts, ports and security options are right"
        )

    def _wrap(self, exc: KafkaException, doing: str) -> Exception:
        err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
        if err is not None and err.code() in (
            KafkaError._INVALID_ARG,
            KafkaError.INVALID_CONFIG,
            KafkaError._UNKNOWN_PROTOCOL,
        ):
            why = scrub(err.str(), self._secrets)
            return ConfigurationError(f"Kafka at {self.url}: {doing}: {why}")
        return self._unavailable(f"{doing}: {err.str() if err is not None else exc}")

    def _admin_client(self) -> AdminClient:
        with self._lock:
            if self._admin is None:
                config = self._client_config()
                for name in ("statistics.interval.ms", "stats_cb"):
                    config.pop(name, None)
                try:
                    self._admin = AdminClient(config)
                except KafkaException as exc:
                    raise self._wrap(exc, "creating the admin client") from exc
            return self._admin

    def _check(self) -> None:
        """Fail within ``connect_timeout`` when the brokers do not answer: asked in
        slices of a second at most, so that Ctrl-C ends the wait at once."""
        admin = self._admin_client()
        deadline = time.monotonic() + self.connect_timeout
        slice_ = 0.1
        self._checking = True
        try:
            while True:
                try:
                    admin.list_topics(timeout=min(slice_, max(deadline - time.monotonic(), 0.01)))
                    admin.poll(0)  # the failed attempts' events, served while checking
                    return
                except KafkaException as exc:
                    admin.poll(0)  # hand librdkafka's log lines to Python logging
                    wrapped = self._wrap(
                        exc, f"no answer within connect_timeout={self.connect_timeout:g} s"
                    )
                    if isinstance(wrapped, ConfigurationError) or time.monotonic() >= deadline:
                        raise wrapped from exc
                slice_ = min(slice_ * 2, _SLICE)
        except BaseException:
            self.close()
            raise
        finally:
            self._checking = False

    def _producer_now(self) -> Producer:
        with self._lock:
            if self._closed:
                raise BrokerUnavailable(f"the Kafka adapter for {self.url} is closed")
            if self._producer is None:
                config = self._client_config("producer")
                config.update(
                    {
                        "enable.idempotence": True,
                        "acks": "all",
                        "message.timeout.ms": int(self.retry_for * 1000),
                    }
                )
                config.setdefault("linger.ms", 1)
                try:
                    self._producer = Producer(config)
                except KafkaException as exc:
                    raise self._wrap(exc, "creating the producer") from exc
            return self._producer

    def _on_error(self, err: KafkaError) -> None:
        """librdkafka's error events (from whichever client's poll serves them)."""
        if err.fatal():
            log.error("Kafka at %s: fatal client error: %s", self.url, err.str())
        if err.code() in _DOWN:
            if self._checking:  # connect() raises within connect_timeout, saying so
                log.debug("Kafka at %s: %s", self.url, err.str())
                return
            if self._down_since is None:
                self._down_since = time.monotonic()
                log.warning(
                    "Kafka at %s is unreachable (%s); retrying, gets and puts fail after %g s",
                    self.url,
                    err.str(),
                    self.retry_for,
                )
            self._down_why = err.str()
        else:
            log.debug("Kafka at %s: %s", self.url, err.str())

    def _on_stats(self, stats: str) -> None:
        """librdkafka's statistics: a broker UP again ends an outage."""
        if self._down_since is None:
            return
        brokers = json.loads(stats).get("brokers", {})
        if any(b.get("state") == "UP" and b.get("nodeid", -1) >= 0 for b in brokers.values()):
            log.warning(
                "Kafka at %s is reachable again (after %.1f s)",
                self.url,
                time.monotonic() - self._down_since,
            )
            self._down_since = None

    def _check_down(self) -> None:
        since = self._down_since
        if since is not None and time.monotonic() - since > self.retry_for:
            raise self._unavailable(f"{self._down_why}, for {time.monotonic() - since:.0f} s")

    # --- the Adapter protocol ------------------------------------------------------

    def declare(self, queue: str, groups: Sequence[str]) -> None:
        """Create the queue's topic if missing (``partitions``, ``replication``); groups
        need nothing: a consumer group appears with its first consumer and starts at the
        earliest offset."""
        self._ensure_topic(self.topic(queue))

    def _ensure_topic(self, topic: str) -> None:
        if topic in self._topics:
            return
        admin = self._admin_client()
        futures = admin.create_topics(
            [NewTopic(topic, self.partitions, self.replication)],
            operation_timeout=self.connect_timeout,
            request_timeout=self.connect_timeout,
        )
        try:
            futures[topic].result(timeout=self.connect_timeout + 5)
        except KafkaException as exc:
            err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
            if err is None or err.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise self._wrap(exc, f"creating topic {topic!r}") from exc
        except TimeoutError as exc:
            raise self._unavailable(f"creating topic {topic!r} timed out") from exc
        self._topics.add(topic)

    def send(self, queue: str, envelopes: Sequence[Envelope]) -> list[str]:
        """Produce every envelope (in order) and wait for their delivery reports; return
        their native references (``<partition>:<offset>``)."""
        topic = self.topic(queue)
        self._ensure_topic(topic)
        items = [(*encode(env), env.body) for env in envelopes]
        return self._produce(topic, items, lambda sent: self.find_sent(queue, sent), envelopes)

    def find_sent(self, queue: str, sent: Sequence[tuple[str, int]]) -> dict[str, str]:
        """Records of ``sent`` the topic holds (``Probing``): read from the put on."""
        if not sent:
            return {}
        probe = Consumer(self._client_config("consumer", **PROBE))
        try:
            wait = self.connect_timeout + 10
            return kafka_find_sent(
                probe, TopicPartition, self.topic(queue), self.partitions, sent, wait
            )
        except KafkaException as exc:
            raise self._wrap(exc, f"reading {self.topic(queue)!r} back") from exc
        except TimeoutError as exc:
            raise self._unavailable(str(exc)) from exc
        finally:
            probe.close()

    def _produce(self, topic: str, items: Items, probe: Probe = None, envs: Envs = ()) -> list[str]:
        """Produce, wait for every delivery report (the idempotent producer rides out a lost
        connection). A producer fatally broken (a broker that forgot its producer id) is
        replaced, and what it did not confirm and ``probe`` (find_sent) does not find is
        produced again once."""
        done: dict[int, str] = {}
        try:
            return self._produce_once(topic, items, done)
        except _Fatal as fatal:
            log.warning(
                "Kafka at %s: producer failed fatally (%s); a new one produces the rest",
                self.url,
                fatal,
            )
            self._reset_producer()
        rest = [i for i in range(len(items)) if i not in done]
        if probe is not None and rest:
            held = probe([(envs[i].msg_id, envs[i].put_at) for i in rest])
            done.update((i, held[envs[i].msg_id]) for i in rest if envs[i].msg_id in held)
            rest = [i for i in rest if i not in done]
        try:
            again = self._produce_once(topic, [items[i] for i in rest], {}) if rest else []
        except _Fatal as fatal:
            self._reset_producer()
            raise self._unavailable(f"producing to {topic!r}: {fatal}") from fatal
        done.update(zip(rest, again, strict=True))
        return [done[i] for i in range(len(items))]

    def _produce_once(self, topic: str, items: Items, done: dict[int, str]) -> list[str]:
        producer = self._producer_now()
        results: list[tuple[KafkaError | None, int, int] | None] = [None] * len(items)
        left = [len(items)]

        def report(i: int) -> Any:
            def on_delivery(err: KafkaError | None, msg: Message) -> None:
                results[i] = (err, msg.partition() or 0, msg.offset() or 0)
                if err is None:  # confirmed: kept if a fatal error cuts the rest short
                    done[i] = ref(msg.partition() or 0, msg.offset() or 0)
                left[0] -= 1

            return on_delivery

        deadline = time.monotonic() + self.retry_for + 5.0
        try:
            for i, (key, headers, body) in enumerate(items):
                while True:
                    try:
                        producer.produce(
                            topic, value=body, key=key, headers=headers, on_delivery=report(i)
                        )
                        break
                    except BufferError:  # the local queue is full: serve reports first
                        producer.poll(0.05)
            while left[0] > 0:
                if time.monotonic() > deadline:
                    raise self._unavailable(
                        f"{left[0]} of {len(items)} record(s) to {topic!r} not acknowledged "
                        f"within {self.retry_for:g} s"
                    )
                producer.poll(0.01)
        except KafkaException as exc:
            err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
            if err is not None and err.fatal():
                raise _Fatal(err.str()) from exc
            raise self._wrap(exc, f"producing to {topic!r}") from exc
        refs: list[str] = []
        sent: dict[int, int] = {}
        failed: list[KafkaError] = []
        for result in results:
            assert result is not None
            err, partition, offset = result
            if err is not None:
                failed.append(err)
                continue
            refs.append(ref(partition, offset))
            sent[partition] = max(sent.get(partition, -1), offset)
        now = time.monotonic()
        with _SENT_LOCK:
            seen = _SENT.setdefault((self._servers, topic), {})
            for partition, offset in sent.items():
                seen[partition] = (max(seen.get(partition, (-1, 0.0))[0], offset), now)
        if failed:
            err = failed[0]
            if err.fatal():
                raise _Fatal(err.str())
            if err.code() in (
                KafkaError.UNKNOWN_TOPIC_OR_PART,
                KafkaError._UNKNOWN_TOPIC,
                KafkaError._MSG_TIMED_OUT,
            ):
                # Deleted, or a broker that forgot it (restarted empty): the next put
                # creates the topic again, with a new producer (the old one's sequence
                # numbers may be unknown to the broker now).
                self._topics.discard(topic)
                self._reset_producer()
            if err.code() in (
                KafkaError._MSG_TIMED_OUT,
                KafkaError._TRANSPORT,
                KafkaError.UNKNOWN_TOPIC_OR_PART,
                KafkaError._UNKNOWN_TOPIC,
            ) or (err.code() in _DOWN):
                raise self._unavailable(
                    f"{len(failed)} of {len(items)} record(s) to {topic!r} not stored: {err.str()}"
                )
            raise BrokerRefused(
                f"Kafka at {self.url} refused {len(failed)} of {len(items)} record(s) "
                f"produced to topic {topic!r} (first: {err.str()}); check the broker's "
                f"limits (message.max.bytes), the topic and the credentials' ACLs"
            )
        return refs

    def _reset_producer(self) -> None:
        with self._lock:
            self._producer = None

    def _feed(self, queue: str, group: str) -> Feed:
        key = (queue, group)
        feed = self._feeds.get(key)
        if feed is None:
            with self._lock:
                if self._closed:
                    raise BrokerUnavailable(f"the Kafka adapter for {self.url} is closed")
                feed = self._feeds.get(key)
                if feed is None:
                    topic = self.topic(queue)
                    self._ensure_topic(topic)
                    config = self._client_config(
                        "consumer",
                        **{
                            "group.id": self.group_id(queue, group),
                            "enable.auto.commit": False,
                            "enable.auto.offset.store": False,
                        },
                    )
                    config.setdefault("auto.offset.reset", "earliest")
                    config.setdefault("fetch.wait.max.ms", 50)
                    # A topic created again (deleted, or a broker that restarted empty) is
                    # seen within seconds, not librdkafka's default five minutes.
                    config.setdefault("topic.metadata.refresh.interval.ms", 5000)
                    try:
                        feed = Feed(
                            config,
                            topic,
                            group,
                            buffer=self.buffer,
                            revoke_wait=self.revoke_wait,
                            on_error=self._on_error,
                        )
                    except KafkaException as exc:
                        raise self._wrap(exc, f"starting a consumer of {topic!r}") from exc
                    self._feeds[key] = feed
        return feed

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
        """Records this process read for the group: held ones idle for ``min_idle``
        first, then the next in offset order per partition, each ordering key fenced.
        Blocks up to ``timeout``, and past it for records this process produced to the
        topic and the group's consumer has not read yet: its group joining (a new
        consumer's first call only: the join goes on in the background) or its fetch;
        ``join_timeout`` at most for all the groups ``consumer`` reads."""
        self._check_down()
        feed = self._feed(queue, group)
        with _SENT_LOCK:
            sent = dict(_SENT.get((self._servers, feed.topic), {}))
        start = time.monotonic()
        deadline = start + max(timeout, 0.0)
        grace: float | None = None  # set once this call waits past its timeout
        joining = not feed.join_waited and not feed.assigned.is_set()
        feed.join_waited = True
        while True:
            try:
                out = feed.take(consumer, count, min_idle, time.monotonic())
            except KafkaException as exc:
                raise self._wrap(exc, f"reading {feed.topic!r}") from exc
            except FeedFailed as exc:
                raise self._unavailable(str(exc)) from exc
            if out:
                return out
            now = time.monotonic()
            if feed.assigned.is_set():
                behind = bool(sent) and not feed.caught_up(sent)
            else:
                behind = joining and bool(sent)
            until = deadline
            if behind and now >= deadline:
                if grace is None:
                    grace = self._grace_until((queue, consumer), now)
                until = max(deadline, grace)
            if now >= until:
                if joining and not feed.assigned.is_set():
                    log.info(
                        "Kafka group %s: no partitions assigned yet after %g s (join_timeout); "
                        "joining goes on in the background",
                        self.group_id(queue, group),
                        self.join_timeout,
                    )
                return []
            with feed.lock:
                if not feed.waiting():
                    feed.lock.wait(min(until - now, 0.05))
            self._check_down()

    def _grace_until(self, key: tuple[str, str], now: float) -> float:
        """Until when a consumer's read may wait past its timeout: ``join_timeout`` from
        the first such wait, shared by the reads that follow within it (a get reads each
        of its subscriber's groups in turn: their joins together stay within the bound)."""
        with self._grace_lock:
            until = self._grace.get(key, 0.0)
            if until <= now:
                if len(self._grace) > 1000:
                    self._grace = {k: u for k, u in self._grace.items() if u > now}
                until = self._grace[key] = now + self.join_timeout
            return until

    def ack(self, queue: str, group: str, refs: Sequence[str]) -> None:
        """The group is finished with these records: their offsets may be committed
        (by the consumer's thread, one commit for a batch). Records this process did
        not read are left alone."""
        feed = self._feeds.get((queue, group))
        if feed is not None:
            feed.settle(refs)

    def requeue(self, queue: str, group: str, ref: str) -> None:
        """Hand the record out again, from memory (Kafka cannot requeue; the partition
        is not rewound)."""
        feed = self._feeds.get((queue, group))
        if feed is not None:
            feed.give_back(ref)

    def left_pending(self, queue: str, group: str, refs: Sequence[str]) -> None:
        """The facade left these records pending (held by a consumer this process does
        not know): their ordering keys stay fenced until they are settled."""
        feed = self._feeds.get((queue, group))
        if feed is not None:
            feed.left_pending(refs)

    def owns(self, queue: str, group: str, native_ref: str) -> bool:
        """Whether this process reads the record's partition for the group now: only
        the partition's reader may hand its records out again through the index."""
        feed = self._feeds.get((queue, group))
        return feed is not None and feed.owns(native_ref)

    def dead_letter(self, queue: str, group: str, ref: str, reason: str) -> None:
        """Copy the record with the reason to the queue's dead-letter topic (waited for),
        then settle it. A record this process does not hold is not here to park."""
        feed = self._feeds.get((queue, group))
        rec = feed.record(ref) if feed is not None else None
        if feed is None or rec is None:
            return
        topic = self.dead_topic(queue)
        self._ensure_topic(topic)
        key, headers = encode(rec.env)
        headers += [
            ("iq-reason", reason.encode()),
            ("iq-group", group.encode()),
            ("iq-queue", queue.encode()),
            ("iq-from", ref.encode()),
        ]
        self._produce(topic, [(key, headers, rec.env.body)])
        feed.settle([ref])

    def read(self, queue: str, ref: str) -> Envelope | None:
        """None: records are not read back by reference (the facade keeps copies)."""
        return None

    def read_many(self, queue: str, refs: Sequence[str]) -> list[Envelope | None]:
        """None for each: see :meth:`read`."""
        return [None] * len(refs)

    def delete(self, queue: str, refs: Sequence[str]) -> None:
        """Nothing: Kafka deletes records by retention only (the index forgets them)."""

    def close(self) -> None:
        """Commit what is settled, leave the groups, flush the producer (bounded)."""
        with self._lock:
            self._closed = True
            feeds = list(self._feeds.values())
            self._feeds.clear()
            producer, self._producer = self._producer, None
            self._admin = None
        for feed in feeds:
            feed.close()
        if producer is not None:
            # In short slices: Ctrl-C ends the wait for unsent records at once.
            deadline = time.monotonic() + min(self.retry_for, 10.0)
            while producer.flush(0.1) > 0 and time.monotonic() < deadline:
                pass

    def entries(self, queue: str) -> Iterator[Entry]:
        """Every record the queue's topic holds (``Inventory``)."""
        return kafka_entries(self, queue)

    def unacked(self, queue: str, group: str) -> Unacked:
        """Records at or past the group's committed offsets, as unread (``Inventory``)."""
        return kafka_unacked(self, queue, group)

    def redeliver(self, queue: str, group: str, ref: str) -> bool:
        """False: one group reads one record again only by rewinding its partition."""
        return False

    # --- tests, operations ---------------------------------------------------------

    def rewind(self, queue: str, group: str, native_ref: str) -> None:
        """Make the group read a partition again from a record on (as after a commit
        lost in a crash): what it finished since comes again. For tests and repair."""
        partition, offset = parse_ref(native_ref)
        self._feed(queue, group).rewind(partition, offset)

    def dead_letters(self, queue: str, count: int = 100) -> list[tuple[dict[str, str], bytes]]:
        """The first records of the queue's dead-letter topic (headers and value). For
        tests and operators."""
        topic = self.dead_topic(queue)
        consumer = Consumer(
            self._client_config(
                "consumer",
                **{"group.id": f"iq-peek-{time.monotonic_ns()}", "enable.auto.commit": False},
            )
        )
        try:
            meta = consumer.list_topics(topic, timeout=self.connect_timeout)
            parts = list(meta.topics[topic].partitions) if topic in meta.topics else []
            consumer.assign([TopicPartition(topic, p, 0) for p in parts])
            out: list[tuple[dict[str, str], bytes]] = []
            deadline = time.monotonic() + 3.0
            while len(out) < count and time.monotonic() < deadline:
                for msg in consumer.consume(count - len(out), 0.2):
                    if msg.error() is None:
                        fields = {k: header_text(v) for k, v in header_items(msg.headers())}
                        out.append((fields, bytes(msg.value() or b"")))
            return out
        finally:
            consumer.close()

    def drop(self, queue: str) -> None:
        """Delete the queue's topic and its dead-letter topic (for tests)."""
        topics = [self.topic(queue), self.dead_topic(queue)]
        with self._lock:
            for key in [k for k in self._feeds if k[0] == queue]:
                self._feeds.pop(key).close()
        for future in self._admin_client().delete_topics(topics).values():
            with contextlib.suppress(KafkaException):
                future.result(timeout=self.connect_timeout)
        self._topics.difference_update(topics)

    def __repr__(self) -> str:
        return f"<KafkaAdapter {self.url}>"
