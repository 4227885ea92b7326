"""The configured hubs, connected lazily and kept open, with typed errors that name the
hub (never its URL's password)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence

from iqbridge.admin.config import HubSpec
from iqbridge.errors import ConnectionError, IQError, QueueError
from iqbridge.hub import Hub, connect
from iqbridge.queue import Queue
from iqbridge.redaction import get_logger, redact, url_secrets

__all__ = ["RETRY_AFTER", "HubNotFound", "HubUnavailable", "Hubs", "url_secrets"]

log = get_logger("iqbridge.admin")


class HubNotFound(QueueError):
    """No hub of that name is configured."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"no hub named {name!r} is configured")


class HubUnavailable(IQError):
    """A configured hub cannot be opened or its connection broke: the broker or the
    index store is down or refuses (``reason`` says which and why, free of secrets)."""

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        self.reason = reason
        super().__init__(f"hub {name!r} is unavailable: {reason}")


#: Seconds a hub that could not be opened is reported unavailable before it is tried again.
RETRY_AFTER = 5.0


class Hubs:
    """Every configured hub by name; each is connected on first use and kept open.
    A hub that cannot be reached is tried again on a request at least ``retry_after``
    seconds later (until then it is reported unavailable at once)."""

    def __init__(
        self,
        specs: Sequence[HubSpec],
        retry_after: float = RETRY_AFTER,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._specs = {s.name: s for s in specs}
        self._open: dict[str, Hub] = {}
        self._lock = threading.Lock()
        # One lock per hub: a slow connect to one hub does not hold up the others.
        self._connecting = {name: threading.Lock() for name in self._specs}
        self._retry_after = retry_after
        self._clock = clock
        self._failed: dict[str, tuple[float, str]] = {}

    def names(self) -> list[str]:
        """The hubs' names, in configuration order."""
        return list(self._specs)

    def spec(self, name: str) -> HubSpec:
        """A hub's configuration; HubNotFound when none has that name."""
        spec = self._specs.get(name)
        if spec is None:
            raise HubNotFound(name)
        return spec

    def redacted_url(self, name: str) -> str:
        """The hub's broker URL with its secrets (password, secret options) as ``***``."""
        return redact(self.spec(name).url)

    def secrets(self) -> list[str]:
        """Every secret in the configured URLs (see :func:`~iqbridge.redaction.url_secrets`)."""
        out: list[str] = []
        for s in self._specs.values():
            out += url_secrets(s.url) + url_secrets(s.index)
        return out

    def hub(self, name: str) -> Hub:
        """The open hub ``name`` (connected now if it was not)."""
        spec = self.spec(name)
        with self._connecting[name]:
            with self._lock:
                hub = self._open.get(name)
            if hub is not None:
                return hub
            failed = self._failed.get(name)
            if failed is not None and self._clock() - failed[0] < self._retry_after:
                raise HubUnavailable(name, failed[1])
            try:
                hub = connect(spec.url, spec.index, publisher="iq-admin")
            except IQError as exc:
                reason = self._reason(name, exc)
                log.warning("hub %r (%s) cannot be opened: %s", name, self._where(name), reason)
                self._failed[name] = (self._clock(), reason)
                raise HubUnavailable(name, reason) from None
            self._failed.pop(name, None)
            with self._lock:
                self._open[name] = hub
            return hub

    @contextlib.contextmanager
    def using(self, name: str) -> Iterator[Hub]:
        """The open hub ``name``; a connection lost meanwhile becomes HubUnavailable."""
        try:
            yield self.hub(name)
        except ConnectionError as exc:
            reason = self._reason(name, exc)
            log.warning("hub %r (%s) failed: %s", name, self._where(name), reason)
            raise HubUnavailable(name, reason) from None

    def _where(self, name: str) -> str:
        """The hub's redacted broker URL, and its index URL when it has one."""
        spec = self.spec(name)
        index = f", index {redact(spec.index)}" if spec.index else ""
        return redact(spec.url) + index

    def _reason(self, name: str, exc: IQError) -> str:
        """What went wrong, as the adapter or store said it (they redact the URLs they
        name), with the hub's passwords masked again in case one slipped through."""
        text = f"{type(exc).__name__}: {exc}"
        spec = self.spec(name)
        for secret in url_secrets(spec.url) + url_secrets(spec.index):
            text = text.replace(secret, "***")
        return text

    def queue(self, hub: str, queue: str) -> Queue:
        """An existing queue of a hub (UnknownQueueError when nobody has used it)."""
        return self.hub(hub).queue(queue, create=False)

    def queue_names(self, hub: str) -> list[str]:
        """The queues a hub's index knows, sorted."""
        return sorted(self.hub(hub).store.queues())

    def close(self) -> None:
        """Close every open hub."""
        with self._lock:
            hubs, self._open = list(self._open.values()), {}
        for h in hubs:
            try:
                h.close()
            except Exception:  # closing is best effort; nothing to report to a caller
                log.warning("closing a hub failed", exc_info=False)
