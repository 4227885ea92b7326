"""What every command shares: the global options, the consoles, opening the hub and queues."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import typer
from rich.console import Console

import iqbridge
from iqbridge.redaction import redact, url_secrets

__all__ = ["CommandError", "Settings", "open_hub", "open_queue", "settings"]


class CommandError(Exception):
    """A failure the command explains in one line (exit code 1)."""


@dataclass
class Settings:
    """The global options, filled in by the app callback."""

    url: str = iqbridge.DEFAULT_URL
    index: str | None = None
    debug: bool = False
    out: Console = field(default_factory=lambda: Console(highlight=False))
    err: Console = field(default_factory=lambda: Console(stderr=True, highlight=False))
    #: Secrets a command learnt of (a bridge config's URLs), scrubbed like the rest.
    more_secrets: list[str] = field(default_factory=list)

    @property
    def safe_url(self) -> str:
        """The broker URL without its secrets (password, secret options)."""
        return redact(self.url)

    def secrets(self) -> list[str]:
        """The secrets of the URLs given, to scrub from anything printed."""
        return [*self.more_secrets, *url_secrets(self.url), *url_secrets(self.index)]


def settings(ctx: typer.Context) -> Settings:
    """The Settings of this invocation."""
    obj = ctx.find_root().obj
    if not isinstance(obj, Settings):  # invoked without the app callback (embedding)
        obj = Settings()
        ctx.find_root().obj = obj
    return obj


def _sqlite_path(url: str) -> Path | None:
    if not url.lower().startswith("sqlite://"):
        return None
    rest = url.split("://", 1)[1].split("?", 1)[0]
    if not rest.startswith("/"):
        return None
    rest = rest[1:]
    return Path(rest) if rest and rest != ":memory:" else None


@contextlib.contextmanager
def open_hub(ctx: typer.Context, *, create: bool = True) -> Iterator[iqbridge.Hub]:
    """Connect to the global ``--url``/``--index``.

    With ``create=False`` a SQLite file that does not exist is an error instead of a new
    empty database (commands that only read or move existing messages).
    """
    cfg = settings(ctx)
    path = _sqlite_path(cfg.url)
    if not create and path is not None and not path.exists():
        raise CommandError(
            f"no iqbridge database at {path} (nothing put there yet?); "
            f"pass --url or set IQ_URL to the one you use"
        )
    hub = iqbridge.connect(cfg.url, cfg.index)
    try:
        yield hub
    finally:
        hub.close()


def open_queue(hub: iqbridge.Hub, name: str, *, create: bool = False) -> iqbridge.Queue:
    """A queue; unless ``create``, one that already exists (UnknownQueueError otherwise)."""
    return hub.queue(name, create=create)
