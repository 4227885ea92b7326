"""Export an index store's journal to Parquet, a page at a time and incrementally.

:func:`export_journal` reads ``store.journal(after, page_size)`` page by page and writes
each page's transitions to ``DIR/journal`` and the messages they create to
``DIR/messages`` (layout and columns: :mod:`iqbridge.analytics.schema`). A watermark per
store, ``DIR/_iqexport/<store id>.json``, says what is exported already, so a re-run
exports only what is new and never a row twice::

    {"store": url, "floor": F, "high": H, "gaps": {"<seq>" or "<lo>-<hi>": first_seen},
     "pending": null | {"batch": name, "files": [paths relative to DIR]}}

Every seq <= F is exported or known never to exist; every seq in (F, H] is exported but
the gaps. Only a SQL server store (PostgreSQL, MariaDB/MySQL, Oracle) can show a sequence
number before a smaller one commits (numbers are handed out when a transaction writes,
and it may commit late or roll back), so for those the exporter remembers each number it
has not seen below H, with when it first missed it, and reads again from F next time: a
number that shows up is exported then; one still missing after ``gap_grace`` seconds is
taken as rolled back and forgotten. Other stores commit in order (and SQLite and Redis
number entries sparsely, by row), so nothing below H can still appear there.

Crash safety (a kill at any instant, then a re-run, gives every row exactly once): each
page's files are written and fsynced under ``DIR/_iqexport/staging/<store id>/<batch>/``;
then the watermark is replaced atomically with the page's new floor, high and gaps and
``pending`` naming the batch and its files (the commit point); then each staged file is
moved to its place (``os.replace``); then the watermark is written again without
``pending``. A run first rolls a recorded pending batch forward and deletes any other
staging directory of its store (pages never committed). File names are
``part-<store id>-<first seq>-<last seq>.parquet`` with the seqs of the rows inside, which
no other file of the store has, so several stores can export into one directory.

pyarrow is imported only when an export runs (``pip install 'iqbridge[spark]'``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
import time
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from iqbridge.analytics.schema import (
    JOURNAL,
    MESSAGES,
    STATE_DIR,
    escape_partition,
    journal_schema,
    messages_schema,
)
from iqbridge.errors import ConfigurationError, IQError
from iqbridge.model import JournalEntry, MessageRecord, from_micros
from iqbridge.states import ActorKind
from iqbridge.stores.base import IndexStore

__all__ = [
    "ExportError",
    "ExportResult",
    "Gap",
    "JournalExporter",
    "Watermark",
    "export_journal",
    "late_commits",
    "store_id",
]

#: URL schemes (before any ``+driver``) of stores whose sequence numbers can commit out
#: of order: SQL servers handing out identity values to concurrent transactions.
_LATE_SCHEMES = frozenset({"postgresql", "postgres", "mysql", "mariadb", "oracle"})
#: Messages read (records, then retained payloads) per round trip while writing a page.
_CHUNK = 1000
_DAY_US = 86_400 * 1_000_000


class ExportError(IQError):
    """The export cannot go on: its state in the target directory is damaged, or another
    export of the same store into it is running."""


def store_id(url: str) -> str:
    """The short stable id of a store (12 hex digits of its password-free URL's hash),
    used in the watermark's and the exported files' names."""
    return hashlib.blake2b(url.encode("utf-8"), digest_size=6).hexdigest()


def late_commits(store: IndexStore) -> bool:
    """Whether the store may show a journal sequence number before a smaller one commits
    (a SQL server store; see the module docstring)."""
    scheme = store.url.split("://", 1)[0].lower()
    return scheme.split("+", 1)[0] in _LATE_SCHEMES


@dataclass(frozen=True, slots=True)
class ExportResult:
    """What one export run did, and the watermark it left."""

    #: The store's password-free URL and its short id.
    store: str
    store_id: str
    #: Journal rows (transitions) and messages rows written, and files written.
    rows: int
    messages: int
    files: int
    #: Every seq <= floor is exported (or never existed); high is the highest exported.
    floor: int
    high: int
    #: Sequence numbers between floor and high not seen yet (a late commit may fill them).
    gaps: int


@dataclass
class Gap:
    """Sequence numbers ``lo`` to ``hi`` not seen yet, first missed at ``since`` (epoch
    seconds)."""

    lo: int
    hi: int
    since: float


@dataclass
class Watermark:
    """The export state of one store in one directory (see the module docstring)."""

    store: str
    floor: int = 0
    high: int = 0
    #: Ranges of missing sequence numbers, sorted and disjoint, with when first missed.
    gaps: list[Gap] = field(default_factory=list)
    #: ``(batch, files)`` of a page committed but maybe not yet moved into place.
    pending: tuple[str, list[str]] | None = None

    def to_json(self) -> dict[str, Any]:
        """The JSON object stored in ``_iqexport/<store id>.json``."""
        gaps = {(f"{g.lo}" if g.lo == g.hi else f"{g.lo}-{g.hi}"): g.since for g in self.gaps}
        pending = None
        if self.pending is not None:
            pending = {"batch": self.pending[0], "files": list(self.pending[1])}
        return {
            "store": self.store,
            "floor": self.floor,
            "high": self.high,
            "gaps": gaps,
            "pending": pending,
        }

    @classmethod
    def from_json(cls, data: Any) -> Watermark:
        """Parse a stored watermark; ValueError, KeyError or TypeError if malformed."""
        gaps: list[Gap] = []
        for key, since in dict(data["gaps"]).items():
            lo, _, hi = str(key).partition("-")
            gaps.append(Gap(int(lo), int(hi or lo), float(since)))
        gaps.sort(key=lambda g: g.lo)
        pending = data.get("pending")
        wm = cls(str(data["store"]), int(data["floor"]), int(data["high"]), gaps)
        if pending is not None:
            wm.pending = (str(pending["batch"]), [str(f) for f in pending["files"]])
        return wm

    def covers(self, seq: int, los: Sequence[int] | None = None) -> bool:
        """Whether ``seq`` is one of the gaps (``los``: every gap's ``lo``, if known)."""
        i = bisect_right([g.lo for g in self.gaps] if los is None else los, seq) - 1
        return i >= 0 and self.gaps[i].hi >= seq

    def fill(self, found: Sequence[int]) -> None:
        """Take the (sorted) sequence numbers that showed up out of the gaps."""
        if not found:
            return
        out: list[Gap] = []
        for g in self.gaps:
            start = g.lo
            for seq in found[bisect_left(found, g.lo) : bisect_right(found, g.hi)]:
                if seq > start:
                    out.append(Gap(start, seq - 1, g.since))
                start = seq + 1
            if start <= g.hi:
                out.append(Gap(start, g.hi, g.since))
        self.gaps = out

    def expire(self, before: float, scanned: int) -> None:
        """Forget gaps first missed before ``before`` (rolled back) that this run has
        read past (their whole range is at most ``scanned``)."""
        self.gaps = [g for g in self.gaps if g.since >= before or g.hi > scanned]

    def settle_floor(self) -> None:
        """Move the floor up to just below the smallest gap (or to high)."""
        self.floor = self.gaps[0].lo - 1 if self.gaps else self.high

    def missing(self) -> int:
        """How many sequence numbers the gaps hold."""
        return sum(g.hi - g.lo + 1 for g in self.gaps)


def _arrow() -> tuple[Any, Any]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise ConfigurationError(
            f"the journal export needs pyarrow ({exc}): pip install 'iqbridge[spark]'"
        ) from None
    return pa, pq


def _fsync_dir(path: Path) -> None:
    if os.name == "nt":  # pragma: no cover - a directory cannot be opened for fsync there
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _make_dirs(path: Path, made: set[Path]) -> None:
    """Create ``path`` and its missing parents; add each one created to ``made``."""
    missing: list[Path] = []
    while not path.is_dir():
        missing.append(path)
        path = path.parent
    for d in reversed(missing):
        d.mkdir(exist_ok=True)
        made.add(d)


def _fsync_dirs(files: set[Path], made: set[Path]) -> None:
    """Make new files' names and new directories' names durable: fsync the directories
    holding ``files`` and the parents of the directories in ``made``."""
    for d in sorted({f.parent for f in files} | {d.parent for d in made}, key=str):
        _fsync_dir(d)


class _Days:
    """``YYYY-MM-DD`` of microsecond timestamps, cached by day."""

    def __init__(self) -> None:
        self._cache: dict[int, str] = {}

    def __call__(self, us: int) -> str:
        day = us // _DAY_US
        text = self._cache.get(day)
        if text is None:
            text = self._cache[day] = from_micros(day * _DAY_US).date().isoformat()
        return text


class JournalExporter:
    """Exports one store's journal into one directory; see :func:`export_journal`.

    Holds an exclusive lock on ``DIR/_iqexport/<store id>.lock`` while it runs (POSIX
    advisory lock), so two exports of one store into one directory never interleave.
    :meth:`run` may be called again for the next increment.
    """

    _arrow: tuple[Any, Any]  # pyarrow and pyarrow.parquet, imported by run()
    _made: set[Path]  # directories created while staging a page

    def __init__(
        self,
        store: IndexStore,
        to: str | Path,
        *,
        page_size: int = 50_000,
        payloads: bool = True,
        gap_grace: float = 300.0,
        progress: Callable[[int], None] | None = None,
        now: Callable[[], float] = time.time,
        late: bool | None = None,
    ) -> None:
        if page_size < 1:
            raise ConfigurationError(f"page_size must be at least 1, not {page_size}")
        if gap_grace < 0:
            raise ConfigurationError(f"gap_grace must be >= 0 seconds, not {gap_grace}")
        self.store = store
        self.root = Path(to)
        self.page_size = page_size
        self.payloads = payloads
        self.gap_grace = gap_grace
        self.progress = progress
        self.now = now
        self.late = late_commits(store) if late is None else late
        self.url = store.url
        self.id = store_id(self.url)
        self._state = self.root / STATE_DIR
        self._wm_path = self._state / f"{self.id}.json"
        self._staging = self._state / "staging" / self.id
        self._days = _Days()
        self._rows = self._messages = self._files = 0

    # --- the run ---------------------------------------------------------------------

    def run(self) -> ExportResult:
        """Finish an interrupted page, then export every page past the watermark."""
        self._arrow = _arrow()
        self._rows = self._messages = self._files = 0
        try:
            for top in (STATE_DIR, JOURNAL, MESSAGES):  # readers find both datasets
                (self.root / top).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ExportError(f"cannot create the export directory {self.root}: {exc}") from None
        try:
            with self._locked():
                wm = self._run()
        except OSError as exc:
            raise ExportError(f"cannot write the export in {self.root}: {exc}") from exc
        return ExportResult(
            self.url,
            self.id,
            self._rows,
            self._messages,
            self._files,
            wm.floor,
            wm.high,
            wm.missing(),
        )

    def _run(self) -> Watermark:
        wm = self._recover()
        after = wm.floor
        while True:
            page = self.store.journal(after, self.page_size)
            if not page:
                break
            after = self._page(wm, after, page)
        before = (wm.floor, wm.high, wm.to_json()["gaps"])
        wm.expire(self.now() - self.gap_grace, wm.high)
        wm.settle_floor()
        if (wm.floor, wm.high, wm.to_json()["gaps"]) != before:
            self._save(wm)
        return wm

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows: no advisory locks to take
            yield
            return
        with (self._state / f"{self.id}.lock").open("a+b") as lock:
            try:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise ExportError(
                    f"another export of {self.url} into {self.root} is running; wait for it"
                ) from None
            try:
                yield
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def _recover(self) -> Watermark:
        """The stored watermark, its pending page rolled forward, stale staging removed."""
        wm = self._load()
        if wm.pending is not None:
            self._finish(wm)
        if self._staging.exists():
            for stale in self._staging.iterdir():
                shutil.rmtree(stale, ignore_errors=True)
        return wm

    def _page(self, wm: Watermark, after: int, page: list[JournalEntry]) -> int:
        """Export what is new in one page; return the cursor for the next read."""
        now = self.now()
        old_high = wm.high
        before = (wm.floor, wm.high, len(wm.gaps), wm.missing())
        rows: list[JournalEntry] = []
        found: list[int] = []
        los = [g.lo for g in wm.gaps]  # gaps added below all lie above old_high
        prev = after
        for e in page:
            seq = e.seq
            if seq is None:
                raise ExportError(f"{self.url} returned a journal entry without a seq: {e}")
            if seq > old_high:
                rows.append(e)
                lo = max(prev, old_high) + 1
                if self.late and lo < seq:
                    wm.gaps.append(Gap(lo, seq - 1, now))
            elif wm.covers(seq, los):
                rows.append(e)
                found.append(seq)
            prev = seq
        last = prev
        wm.fill(found)
        wm.high = max(old_high, last)
        wm.expire(now - self.gap_grace, last)
        wm.settle_floor()
        if rows:
            self._commit(wm, rows)
        elif (wm.floor, wm.high, len(wm.gaps), wm.missing()) != before:
            self._save(wm)
        if self.progress is not None:
            self.progress(self._rows)
        return last

    # --- one page: stage, commit, move -----------------------------------------------

    def _commit(self, wm: Watermark, rows: list[JournalEntry]) -> None:
        first = rows[0].seq or 0
        batch = f"{first:020d}-{secrets.token_hex(4)}"
        stage = self._staging / batch
        self._made = set()
        files = self._write_journal(stage, rows)
        files += self._write_messages(stage, rows)
        _fsync_dirs({stage / f for f in files}, self._made)
        wm.pending = (batch, files)
        self._save(wm)
        self._finish(wm)
        self._rows += len(rows)
        self._files += len(files)

    def _finish(self, wm: Watermark) -> None:
        """Move a committed page's staged files into place; clear ``pending``."""
        assert wm.pending is not None
        batch, files = wm.pending
        stage = self._staging / batch
        made: set[Path] = set()
        for rel in files:
            src, dst = stage / rel, self.root / rel
            if src.exists():
                _make_dirs(dst.parent, made)
                src.replace(dst)
            elif not dst.exists():
                raise ExportError(
                    f"{dst} is missing, and so is its staged copy {src}: the export in "
                    f"{self.root} was changed by hand; remove {self._wm_path} and every "
                    f"part-{self.id}-*.parquet file under it to export {self.url} afresh"
                )
        _fsync_dirs({self.root / rel for rel in files}, made)
        wm.pending = None
        self._save(wm)
        shutil.rmtree(stage, ignore_errors=True)

    def _load(self) -> Watermark:
        try:
            text = self._wm_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return Watermark(self.url)
        try:
            wm = Watermark.from_json(json.loads(text))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ExportError(
                f"the export watermark {self._wm_path} is damaged ({type(exc).__name__}: "
                f"{exc}); remove it and every part-{self.id}-*.parquet file to export afresh"
            ) from None
        if wm.store != self.url:
            raise ExportError(
                f"the watermark {self._wm_path} belongs to {wm.store}, not {self.url} "
                f"(the same short id); export one of them into another directory"
            )
        return wm

    def _save(self, wm: Watermark) -> None:
        """Replace the watermark atomically (write, fsync, rename, fsync directory)."""
        tmp = self._wm_path.with_name(self._wm_path.name + ".tmp")
        data = json.dumps(wm.to_json(), separators=(",", ":")).encode("utf-8")
        with tmp.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(self._wm_path)
        _fsync_dir(self._state)

    # --- writing Parquet ---------------------------------------------------------------

    def _rel(self, kind: str, day: str, queue: str, first: int, last: int) -> str:
        return (
            f"{kind}/date={day}/queue={escape_partition(queue)}/"
            f"part-{self.id}-{first:020d}-{last:020d}.parquet"
        )

    def _write_journal(self, stage: Path, rows: list[JournalEntry]) -> list[str]:
        """The page's transitions, one file per day and queue; their relative paths."""
        pa, pq = self._arrow
        schema = journal_schema()
        groups: dict[tuple[str, str], list[JournalEntry]] = {}
        for e in rows:
            groups.setdefault((self._days(e.at), e.queue), []).append(e)
        files: list[str] = []
        for (day, queue), entries in groups.items():
            rel = self._rel(JOURNAL, day, queue, entries[0].seq or 0, entries[-1].seq or 0)
            table = pa.table(
                {
                    "store": [self.url] * len(entries),
                    "seq": [e.seq for e in entries],
                    "msg_id": [e.msg_id for e in entries],
                    "actor": [e.actor for e in entries],
                    "actor_kind": [str(e.actor_kind) for e in entries],
                    "src": [None if e.src is None else str(e.src) for e in entries],
                    "dst": [str(e.dst) for e in entries],
                    "at": [e.at for e in entries],
                    "attempt": [e.attempt for e in entries],
                    "detail": [e.detail for e in entries],
                },
                schema=schema,
            )
            with self._open(stage / rel) as f:
                pq.write_table(table, f)
            files.append(rel)
        return files

    def _write_messages(self, stage: Path, rows: list[JournalEntry]) -> list[str]:
        """The messages rows of the page's creations that the store still has (a purged
        message has none), one file per day and queue; their relative paths."""
        creations = [e for e in rows if e.actor_kind == ActorKind.PUBLISHER and e.src is None]
        groups: dict[tuple[str, str], list[tuple[int, MessageRecord]]] = {}
        for i in range(0, len(creations), _CHUNK):
            chunk = creations[i : i + _CHUNK]
            records = self.store.load_many([e.msg_id for e in chunk])
            for e in chunk:
                rec = records.get(e.msg_id)
                if rec is not None:
                    key = (self._days(rec.created_at), rec.queue)
                    groups.setdefault(key, []).append((e.seq or 0, _slim(rec)))
        pa, pq = self._arrow
        schema = messages_schema()
        files: list[str] = []
        for (day, queue), recs in groups.items():
            rel = self._rel(MESSAGES, day, queue, recs[0][0], recs[-1][0])
            with self._open(stage / rel) as f, pq.ParquetWriter(f, schema) as writer:
                for i in range(0, len(recs), _CHUNK):
                    writer.write_table(self._messages_table(pa, schema, recs[i : i + _CHUNK]))
            files.append(rel)
            self._messages += len(recs)
        return files

    def _messages_table(self, pa: Any, schema: Any, recs: list[tuple[int, MessageRecord]]) -> Any:
        kept = self.store.retained([r.msg_id for _, r in recs]) if self.payloads else {}
        bodies: list[bytes | None] = []
        headers: list[str | None] = []
        for _, r in recs:
            copy = kept.get(r.msg_id)
            bodies.append(None if copy is None else bytes(copy.body))
            headers.append(
                None if copy is None else json.dumps(dict(copy.headers), ensure_ascii=False)
            )
        return pa.table(
            {
                "store": [self.url] * len(recs),
                "seq": [seq for seq, _ in recs],
                "msg_id": [r.msg_id for _, r in recs],
                "publisher": [r.publisher for _, r in recs],
                "ordering_key": [r.ordering_key for _, r in recs],
                "correlation_id": [r.correlation_id for _, r in recs],
                "priority": [r.priority for _, r in recs],
                "mode": [str(r.mode) for _, r in recs],
                "parents": [list(r.parents) for _, r in recs],
                "put_at": [r.created_at for _, r in recs],
                "content_type": [r.content_type for _, r in recs],
                "size": [r.size for _, r in recs],
                "native_ref": [r.native_ref for _, r in recs],
                "payload": bodies,
                "headers": headers,
            },
            schema=schema,
        )

    @contextlib.contextmanager
    def _open(self, path: Path) -> Iterator[Any]:
        """A new file, fsynced once the body has written it."""
        _make_dirs(path.parent, self._made)
        with path.open("wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())


def _slim(rec: MessageRecord) -> MessageRecord:
    """The record without its members (the page keeps only what the row needs)."""
    rec.members = {}
    return rec


def export_journal(
    store: IndexStore,
    to: str | Path,
    *,
    page_size: int = 50_000,
    payloads: bool = True,
    gap_grace: float = 300.0,
    progress: Callable[[int], None] | None = None,
    now: Callable[[], float] = time.time,
    late: bool | None = None,
) -> ExportResult:
    """Export ``store``'s journal into the directory ``to``, from where the last export
    of the store into it stopped; return what was exported and the new watermark.

    Reads ``page_size`` journal entries at a time; writes the transitions to
    ``to/journal`` and the messages they create (with their payload and headers where
    the store retained a copy, unless ``payloads=False``) to ``to/messages``. A sequence
    number a SQL server store has not committed yet is waited for ``gap_grace`` seconds
    (by ``now``) before it counts as rolled back; ``late`` forces whether the store can
    commit numbers out of order at all (default: :func:`late_commits`). ``progress`` is
    called after every page with the number of journal rows exported so far.

    Raises ConfigurationError without pyarrow, ExportError when the directory's export
    state is damaged or another export of the store into it is running.
    """
    return JournalExporter(
        store,
        to,
        page_size=page_size,
        payloads=payloads,
        gap_grace=gap_grace,
        progress=progress,
        now=now,
        late=late,
    ).run()
