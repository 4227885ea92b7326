"""The reads of the Redis index store (:mod:`iqbridge.stores.redis`): records
(pipelined), retained payload copies, the claim order (``stores/lua/available.lua``), due
work, histories, search through the narrowest index a filter allows, and the journal
stream."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from functools import partial
from typing import Any

from redis.client import NEVER_DECODE

from iqbridge.errors import MessageNotFound
from iqbridge.model import (
    Filter,
    JournalEntry,
    MessageRecord,
    MessageSummary,
    Retained,
)
from iqbridge.states import PublisherState
from iqbridge.stores.codec import (
    JOURNAL_PER_ROW,
    entries_from_json,
    matches,
    summary,
)
from iqbridge.stores.redis_base import RedisStoreBase
from iqbridge.stores.redis_records import compose_record

__all__ = ["RedisReads"]


class RedisReads(RedisStoreBase):
    """Reads of :class:`~iqbridge.stores.redis.RedisStore`."""

    # --- reads -------------------------------------------------------------------------

    def load(self, msg_id: str) -> MessageRecord:
        """The current record of a message."""
        found = self.load_many([msg_id])
        if msg_id not in found:
            raise MessageNotFound(msg_id)
        return found[msg_id]

    def load_many(self, msg_ids: Sequence[str]) -> dict[str, MessageRecord]:
        """The current records of the known ones of ``msg_ids``, by msg_id (one
        pipelined round trip)."""
        ids = list(dict.fromkeys(msg_ids))
        if not ids:
            return {}

        def read() -> list[Any]:
            pipe = self._r.pipeline(transaction=False)
            for msg_id in ids:
                pipe.hmget(self._record_key(msg_id), "v", "s", "n", "r", "u")
                pipe.hgetall(f"{self.keyspace}ms:{msg_id}")
            rows: list[Any] = pipe.execute()
            return rows

        out: dict[str, MessageRecord] = {}
        rows = self._call(read)
        for i, msg_id in enumerate(ids):
            v, s, n, r, u = rows[2 * i]
            if v is not None:
                over = rows[2 * i + 1]
                flat = [x for kv in over.items() for x in kv] if over else ()
                out[msg_id] = compose_record(msg_id, v, s, n, r, u, flat)
        return out

    def retained(self, msg_ids: Sequence[str]) -> dict[str, Retained]:
        """The retained payload copies of those of ``msg_ids`` that have one (one
        pipelined round trip; bodies as the bytes they were put with)."""
        ids = list(dict.fromkeys(msg_ids))
        if not ids:
            return {}

        def read() -> list[Any]:
            pipe = self._r.pipeline(transaction=False)
            for msg_id in ids:
                # NEVER_DECODE: this client decodes replies as UTF-8; bodies are bytes.
                pipe.execute_command(
                    "HMGET", f"{self.keyspace}b:{msg_id}", "b", "h", **{NEVER_DECODE: True}
                )
            rows: list[Any] = pipe.execute()
            return rows

        out: dict[str, Retained] = {}
        for msg_id, (body, headers) in zip(ids, self._call(read), strict=True):
            if body is not None:
                out[msg_id] = Retained(bytes(body), json.loads(headers or b"{}"))
        return out

    def claimable(
        self, queue: str, subscriber: str, now: int, limit: int, lock_id: str | None = None
    ) -> list[str]:
        """Ids available to a subscriber now: priority first, then put order."""
        k = self.keyspace
        keys = [f"{k}c:{queue}/{subscriber}"]
        if lock_id is not None:
            keys.append(f"{k}l:{queue}/{lock_id}")
        args = [k, subscriber, str(now), str(limit), lock_id or ""]
        return list(self._call(lambda: self._available(keys=keys, args=args)))

    def redeliverable(self, queue: str, subscriber: str, now: int, limit: int) -> list[str]:
        """Available ids on attempt 2 or later."""
        k = self.keyspace
        keys = [f"{k}r:{queue}/{subscriber}"]
        args = [k, subscriber, str(now), str(limit), ""]
        return list(self._call(lambda: self._available(keys=keys, args=args)))

    def due(self, queue: str | None, now: int, limit: int) -> list[str]:
        """Ids with a lapsed lease, time limit or browse lock (earliest first)."""
        queues = [queue] if queue else self.queues()
        found: list[tuple[float, str]] = []
        for name in queues:
            key = f"{self.keyspace}d:{name}"
            rows = self._call(
                partial(
                    self._r.zrange,
                    key,
                    "-inf",
                    now,
                    byscore=True,
                    offset=0,
                    num=limit,
                    withscores=True,
                )
            )
            found += [(score, msg_id) for msg_id, score in rows]
        found.sort()
        return [msg_id for _, msg_id in found[:limit]]

    def history(self, msg_id: str) -> list[JournalEntry]:
        """Every journal entry of one message, in order."""
        return self._call(lambda: self._read_history(msg_id))

    def search(self, queue: str, flt: Filter) -> list[MessageSummary]:
        """Filter on index fields only, never payloads; in put order.

        Reads the narrowest index the filter allows (msg_id, correlation id, lock id,
        publisher state, else the queue) and checks the rest on each record.
        """
        if flt.limit <= 0:
            return []
        if flt.msg_id is not None:
            try:
                rec = self.load(flt.msg_id)
            except MessageNotFound:
                return []
            return [summary(rec)] if rec.queue == queue and matches(rec, flt) else []
        out: list[MessageSummary] = []
        for rec in self._scan(self._search_index(queue, flt), max(100, min(flt.limit * 2, 1000))):
            if matches(rec, flt):
                out.append(summary(rec))
                if len(out) >= flt.limit:
                    break
        return out

    def _search_index(self, queue: str, flt: Filter) -> str:
        k = self.keyspace
        if flt.correlation_id is not None:
            return f"{k}k:{queue}/{flt.correlation_id}"
        if flt.lock_id is not None:
            return f"{k}l:{queue}/{flt.lock_id}"
        if isinstance(flt.state, PublisherState):
            return f"{k}p:{queue}/{flt.state.value}"
        return f"{k}q:{queue}"

    def _scan(self, index: str, page: int) -> Iterator[MessageRecord]:
        """Records listed in a put-order index, a page per round trip."""
        after = "0"
        while True:
            scanned, last, rows = self._call(
                partial(self._page, keys=[index], args=[self.keyspace, after, page])
            )
            for msg_id, v, s, n, r, u, over in rows:
                yield compose_record(msg_id, v, s, n, r, u, over)
            if scanned < page:
                return
            after = last

    def journal(self, after: int = 0, limit: int = 1000) -> list[JournalEntry]:
        """Journal entries with seq greater than ``after``, oldest first."""
        out: list[JournalEntry] = []
        start = f"{after // JOURNAL_PER_ROW}-0"
        count = max(16, min(limit, 5000))
        while len(out) < limit:
            rows = self._call(
                partial(self._r.xrange, self._journal_key, min=start, max="+", count=count)
            )
            if not rows:
                break
            for stream_id, fields in rows:
                n = int(stream_id.split("-", 1)[0])
                entries = entries_from_json(n, fields["m"], fields["q"], fields["e"])
                out.extend(e for e in entries if (e.seq or 0) > after)
            start = "(" + rows[-1][0]
        return out[:limit]

    def queues(self) -> list[str]:
        """Every known queue name."""
        return sorted(self._call(lambda: self._r.smembers(self._queues_key)))
