"""One Kafka consumer group as one process reads it: a consumer on its own thread, the
records it read and has not settled, and the offsets it may commit. See
:mod:`iqbridge.adapters.kafka`.

The rules that make a log behave like the state model's queue:

* every record read is *unsettled* until the group is finished with it (acked: DONE,
  UNUSABLE, EXPIRED, not addressed to it, finished before); a partition's committed
  offset is the lowest unsettled offset, never past one, so after a crash, a restart or a
  rebalance whoever reads the partition next starts at the first record in doubt (and the
  index skips what is finished);
* a record given back (released) goes back to the partition's ready records in offset
  order and is handed out again from memory: the partition is never rewound;
* an ordering key is fenced per partition: a record is handed to a consumer only when no
  earlier unsettled record of its key is held by another consumer or left pending (held,
  per the index, by someone this process does not know); so a key keeps put order across
  consumers, pool members and rebalances;
* partitions taken away in a rebalance are committed (after a bounded wait for what this
  process is still processing of them) before the new owner starts.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from iqbridge.model import Envelope, Received
from iqbridge.redaction import get_logger

from .kafka_wire import addressed_to, decode, ref  # noqa: TID251

__all__ = ["Feed", "FeedFailed", "Record"]

log = get_logger("iqbridge.adapters.kafka")

#: Records read per consume() call.
_CONSUME = 500
#: How long one consume() waits for records (seconds): also how soon a command (seek,
#: close) is taken up.
_POLL = 0.05
#: Offsets are committed at most this often (seconds), and at once when a partition goes.
_COMMIT_EVERY = 0.05


class FeedFailed(Exception):
    """The feed's consumer thread stopped on an error; its gets cannot go on."""


@dataclass(slots=True)
class Record:
    """One record read by this process and not settled yet."""

    partition: int
    offset: int
    key: str
    env: Envelope
    adopted: bool
    count: int = 1
    #: Who it was last handed to ("" while ready), and when (monotonic seconds).
    consumer: str = ""
    since: float = 0.0
    #: The index says someone this process does not know holds it (see Feed.left_pending).
    elsewhere: bool = False

    @property
    def ref(self) -> str:
        return ref(self.partition, self.offset)


@dataclass(slots=True)
class Part:
    """One assigned partition."""

    #: Unsettled records by offset (ascending insertion: read order).
    unsettled: dict[int, Record] = field(default_factory=dict)
    #: Offsets of unsettled records not handed out, ascending.
    ready: list[int] = field(default_factory=list)
    #: Unsettled records handed out, by offset (what the key fence looks at).
    held: dict[int, Record] = field(default_factory=dict)
    #: The next offset to read (last read + 1), or the start (committed) before any read.
    next: int = -1
    committed: int = -1
    #: The high watermark the last fetch reported (-1 until one did), and when it was
    #: looked at (monotonic seconds).
    high: int = -1
    high_at: float = 0.0

    def commit_point(self) -> int:
        """The offset to commit: the lowest unsettled one, else the next to read."""
        return min(self.unsettled) if self.unsettled else self.next


class Feed:
    """A consumer of one group on one topic, its records, offsets and fences.

    Every method is safe from any thread; the consumer itself is only touched by the
    feed's own thread (commands from other threads wait for it): confluent-kafka blocks
    a call from another thread while that thread's consume() runs."""

    def __init__(
        self,
        config: dict[str, Any],
        topic: str,
        group: str,
        *,
        buffer: int,
        revoke_wait: float,
        on_error: Callable[[KafkaError], None],
    ) -> None:
        self.topic = topic
        self.group = group
        self.buffer = buffer
        self.revoke_wait = revoke_wait
        self._on_error = on_error
        self.lock = threading.Condition(threading.RLock())
        self.parts: dict[int, Part] = {}
        #: Set once the first assignment (maybe empty) arrived; whether a get waited
        #: for it already.
        self.assigned = threading.Event()
        self.join_waited = False
        self.generation = 0
        self._commands: list[Callable[[Consumer], None]] = []
        self._stop = False
        self._paused = False
        self._resume_all = False
        self._last_commit = 0.0
        self.failure: BaseException | None = None
        self.consumer = Consumer(config)
        self.consumer.subscribe(
            [topic], on_assign=self._assign, on_revoke=self._revoke, on_lost=self._lost
        )
        self.thread = threading.Thread(
            target=self._run, name=f"iq-kafka-{topic}.{group}", daemon=True
        )
        self.thread.start()

    # --- the feed's thread ---------------------------------------------------------

    def _run(self) -> None:
        consumer = self.consumer
        try:
            while not self._stop:
                self._serve_commands(consumer)
                self._flow(consumer)
                msgs = consumer.consume(_CONSUME, _POLL)
                if msgs:
                    self._take_in(msgs)
                self._watermarks(consumer)
                self._commit(consumer, force=False)
        except BaseException as exc:  # reported to every caller from now on
            log.exception("Kafka consumer of group %s on %s failed", self.group, self.topic)
            with self.lock:
                self.failure = exc
                self.lock.notify_all()
        finally:
            try:
                self._commit(consumer, force=True, sync=True)
            except KafkaException as exc:
                log.warning("Kafka: last offset commit of %s failed: %s", self.group, exc)
            consumer.close()

    def _serve_commands(self, consumer: Consumer) -> None:
        with self.lock:
            commands, self._commands = self._commands, []
        for command in commands:
            command(consumer)

    def _flow(self, consumer: Consumer) -> None:
        """Pause reading while ``buffer`` records wait unsettled; resume below half."""
        with self.lock:
            held = sum(len(p.unsettled) for p in self.parts.values())
            parts = [TopicPartition(self.topic, p) for p in self.parts]
        if held >= self.buffer and parts and (self._resume_all or not self._paused):
            consumer.pause(parts)
            self._paused = True
        elif (self._paused and held < self.buffer // 2) or self._resume_all:
            if parts:
                consumer.resume(parts)
            self._paused = False
        self._resume_all = False

    def _take_in(self, msgs: Sequence[Message]) -> None:
        with self.lock:
            for msg in msgs:
                err = msg.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        self._on_error(err)
                    continue
                partition, offset = msg.partition(), msg.offset()
                if partition is None or offset is None:
                    continue
                part = self.parts.get(partition)
                if part is None:
                    continue  # a partition taken away meanwhile
                if offset in part.unsettled:
                    continue  # read again after a seek: we have it
                again = offset < part.next
                part.next = max(part.next, offset + 1)
                headers = msg.headers()
                to = addressed_to(headers)
                if to is not None and self.group not in to:
                    continue  # not for this group: settled as it passes
                env, adopted = decode(
                    self.topic,
                    partition,
                    offset,
                    msg.key(),
                    msg.value(),
                    headers,
                    msg.timestamp()[1],
                )
                rec = Record(partition, offset, env.ordering_key, env, adopted, 2 if again else 1)
                part.unsettled[offset] = rec
                bisect.insort(part.ready, offset)
            self.lock.notify_all()

    def _watermarks(self, consumer: Consumer) -> None:
        """Note each partition's high watermark as the last fetch reported it (a local
        lookup: the consumer is only ever touched by this thread)."""
        with self.lock:
            partitions = list(self.parts)
        for partition in partitions:
            _low, high = consumer.get_watermark_offsets(
                TopicPartition(self.topic, partition), cached=True
            )
            with self.lock:
                part = self.parts.get(partition)
                if part is not None:
                    part.high = high
                    part.high_at = time.monotonic()

    def _commit(self, consumer: Consumer, *, force: bool, sync: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_commit < _COMMIT_EVERY:
            return
        with self.lock:
            todo = []
            for partition, part in self.parts.items():
                point = part.commit_point()
                if point > part.committed and point >= 0:
                    todo.append(TopicPartition(self.topic, partition, point))
        if not todo:
            return
        self._last_commit = now
        if sync:
            consumer.commit(offsets=todo, asynchronous=False)
        else:
            consumer.commit(offsets=todo, asynchronous=True)
        with self.lock:
            for tp in todo:
                done = self.parts.get(tp.partition)
                if done is not None:
                    done.committed = max(done.committed, tp.offset)

    def _assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        starts: dict[int, int] = {}
        if partitions:
            try:
                for tp in consumer.committed(partitions, timeout=10.0):
                    starts[tp.partition] = tp.offset if tp.offset >= 0 else 0
            except KafkaException as exc:
                log.warning("Kafka: committed offsets of %s unknown (%s)", self.group, exc)
        with self.lock:
            self.generation += 1
            for tp in partitions:
                start = starts.get(tp.partition, -1)
                self.parts[tp.partition] = Part(next=start, committed=start)
            # librdkafka keeps a partition paused when it is assigned back to this
            # consumer: resume everything on the next turn of the loop (unless full).
            self._resume_all = True
            self.assigned.set()
            self.lock.notify_all()
        log.info(
            "Kafka group %s on %s: assigned partitions %s",
            self.group,
            self.topic,
            sorted(tp.partition for tp in partitions),
        )

    def _revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Before the partitions go: wait (``revoke_wait`` at most) for what this process
        is processing of them, then commit what is settled, then forget them."""
        gone = {tp.partition for tp in partitions}
        # Closing: what is not settled now is read again by the next owner.
        deadline = time.monotonic() + (0.0 if self._stop else self.revoke_wait)
        with self.lock:
            for partition in gone:  # nothing more is handed out of them
                part = self.parts.get(partition)
                if part is not None:
                    part.ready.clear()
            while (left := deadline - time.monotonic()) > 0 and any(
                r.consumer and not r.elsewhere
                for p in gone
                if (part := self.parts.get(p)) is not None
                for r in part.unsettled.values()
            ):
                self.lock.wait(min(left, 0.05))
        try:
            self._commit(consumer, force=True, sync=True)
        except KafkaException as exc:
            log.warning("Kafka: offset commit of revoked partitions failed: %s", exc)
        self._forget(gone, "revoked")

    def _lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._forget({tp.partition for tp in partitions}, "lost (session timed out)")

    def _forget(self, gone: set[int], why: str) -> None:
        with self.lock:
            for partition in gone:
                self.parts.pop(partition, None)
            self.generation += 1
            self.lock.notify_all()
        if gone:
            log.info(
                "Kafka group %s on %s: partitions %s %s", self.group, self.topic, sorted(gone), why
            )

    # --- callers' side -------------------------------------------------------------

    def take(self, consumer: str, count: int, min_idle: float | None, now: float) -> list[Received]:
        """Up to ``count`` records for ``consumer``: held ones idle for ``min_idle``
        first, then ready ones in offset order, each key fenced (see the module)."""
        out: list[Received] = []
        with self.lock:
            if self.failure is not None:
                raise FeedFailed(
                    f"the consumer of {self.group} on {self.topic} failed: {self.failure}"
                )
            for part in self.parts.values():
                if len(out) >= count:
                    break
                # Per key: may this consumer take its next record?
                blocked: set[str] = set()
                idle: list[Record] = []
                for rec in part.held.values():
                    lapsed = min_idle is not None and now - rec.since >= min_idle
                    if lapsed:
                        idle.append(rec)
                    elif rec.key and (rec.elsewhere or rec.consumer != consumer):
                        blocked.add(rec.key)
                for rec in idle:
                    if len(out) >= count:
                        break
                    if rec.key and rec.key in blocked:
                        continue
                    rec.count += 1
                    rec.elsewhere = False
                    out.append(self._hand(rec, consumer, now))
                taken: list[int] = []
                for offset in part.ready:
                    if len(out) >= count:
                        break
                    rec = part.unsettled[offset]
                    if rec.key and rec.key in blocked:
                        continue
                    taken.append(offset)
                    out.append(self._hand(rec, consumer, now))
                    part.held[offset] = rec
                if taken == part.ready[: len(taken)]:
                    del part.ready[: len(taken)]  # the usual case: the oldest ones went
                else:
                    gone = set(taken)
                    part.ready = [o for o in part.ready if o not in gone]
        return out

    def _hand(self, rec: Record, consumer: str, now: float) -> Received:
        rec.consumer = consumer
        rec.since = now
        return Received(rec.ref, self.group, rec.env, rec.adopted, delivery_count=rec.count)

    def waiting(self) -> bool:
        """Whether some record is ready to hand out."""
        return any(p.ready for p in self.parts.values())

    def _find(self, native_ref: str) -> tuple[Part, Record] | None:
        part_s, _, off_s = native_ref.partition(":")
        try:
            part = self.parts.get(int(part_s))
            rec = part.unsettled.get(int(off_s)) if part is not None else None
        except ValueError:
            return None
        return (part, rec) if part is not None and rec is not None else None

    def settle(self, refs: Sequence[str]) -> None:
        """The group is finished with these records: their offsets may be committed."""
        with self.lock:
            for native_ref in refs:
                found = self._find(native_ref)
                if found is None:
                    continue  # not read by this process (or its partition went)
                part, rec = found
                del part.unsettled[rec.offset]
                part.held.pop(rec.offset, None)
                if not rec.consumer:
                    i = bisect.bisect_left(part.ready, rec.offset)
                    if i < len(part.ready) and part.ready[i] == rec.offset:
                        del part.ready[i]
            self.lock.notify_all()

    def give_back(self, native_ref: str) -> bool:
        """A handed-out record goes back to the ready ones, in offset order."""
        with self.lock:
            found = self._find(native_ref)
            if found is None or not found[1].consumer:
                return False
            part, rec = found
            part.held.pop(rec.offset, None)
            rec.consumer = ""
            rec.elsewhere = False
            rec.count += 1
            bisect.insort(part.ready, rec.offset)
            self.lock.notify_all()
            return True

    def left_pending(self, refs: Sequence[str]) -> None:
        """The facade left these handed-out records pending: the index says another
        consumer (maybe in another process) holds them. Their keys stay fenced for every
        consumer here until they are settled or idle long enough to be handed out again."""
        with self.lock:
            for native_ref in refs:
                found = self._find(native_ref)
                if found is not None and found[1].consumer:
                    found[1].elsewhere = True

    def owns(self, native_ref: str) -> bool:
        """Whether this process reads the partition of a reference now."""
        part, _, _off = native_ref.partition(":")
        try:
            with self.lock:
                return int(part) in self.parts
        except ValueError:
            return False

    def record(self, native_ref: str) -> Record | None:
        """The unsettled record at a reference, if this process holds it."""
        with self.lock:
            found = self._find(native_ref)
            return found[1] if found is not None else None

    def caught_up(self, sent: dict[int, tuple[int, float]]) -> bool:
        """Whether every record this process produced to an assigned partition (``sent``:
        partition -> highest offset and when it was produced) has been read.

        A broker that lost records (restarted empty) ends below what we produced: where
        fetches a second after the produce still report a high watermark no further
        than what was read, there is nothing more to wait for."""
        with self.lock:
            for p, part in self.parts.items():
                if p not in sent:
                    continue
                offset, at = sent[p]
                if part.next > offset:
                    continue
                lost = 0 <= part.high <= min(part.next, offset) and part.high_at > at + 1.0
                if not lost:
                    return False
            return True

    def rewind(self, partition: int, offset: int) -> None:
        """Read a partition again from ``offset`` (as after a commit lost in a crash):
        records settled since are delivered again (for tests and repair)."""

        def seek(consumer: Consumer) -> None:
            consumer.seek(TopicPartition(self.topic, partition, offset))

        with self.lock:
            self._commands.append(seek)

    def close(self, timeout: float = 10.0) -> None:
        """Commit what is settled and leave the group (the records not settled are read
        again by whoever gets their partitions)."""
        self._stop = True
        self.thread.join(timeout)

    def __repr__(self) -> str:
        return f"<Feed {self.topic} group {self.group}>"
