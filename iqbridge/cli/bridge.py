"""``iq bridge run|check`` and ``iq lineage``: the bridge daemon from the command line."""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.tree import Tree

from iqbridge.bridge import Bridge, Lineage, Node, check_health, load_config
from iqbridge.bridge.config import BridgeConfig
from iqbridge.cli.context import CommandError, Settings, open_hub, settings
from iqbridge.cli.parsing import parse_duration, parse_optional_duration
from iqbridge.hub import Hub, connect
from iqbridge.redaction import get_logger, scrub

__all__ = ["bridge_app", "lineage"]

bridge_app = typer.Typer(
    help="Run bridge daemons between brokers (see docs/bridge.md).", no_args_is_help=True
)


class _OneLine(logging.Handler):
    """Bridge log records as one scrubbed line each on stderr."""

    def __init__(self, cfg: Settings) -> None:
        super().__init__(logging.INFO)
        self.cfg = cfg

    def emit(self, record: logging.LogRecord) -> None:
        text = " ".join(scrub(record.getMessage(), self.cfg.secrets()).split())
        kind = record.levelname.lower()
        self.cfg.err.print(f"iq: bridge: {kind}: {escape(text)}", soft_wrap=True)


@contextlib.contextmanager
def _logging(cfg: Settings) -> Iterator[None]:
    logger = get_logger("iqbridge.bridge")
    handler = _OneLine(cfg)
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)


def _load(cfg: Settings, path: Path) -> BridgeConfig:
    config = load_config(path)
    cfg.more_secrets.extend(config.secrets())
    return config


def _table(bridge: Bridge) -> Table:
    t = Table(title=f"bridge {bridge.config.bridge.name}", expand=False)
    for col in ("route", "active", "read", "bridged", "children", "unusable", "retried"):
        t.add_column(col, justify="left" if col == "route" else "right")
    t.add_column("held", justify="right")
    t.add_column("groups", justify="right")
    t.add_column("last error")
    for s in bridge.stats():
        t.add_row(
            s.name,
            "yes" if s.active else "standby",
            str(s.read),
            str(s.bridged),
            str(s.children),
            str(s.unusable),
            str(s.retried),
            str(s.held),
            str(s.groups),
            escape(s.last_error or ""),
        )
    return t


@bridge_app.command("run")
def run(
    ctx: typer.Context,
    config: Annotated[Path, typer.Argument(help="The bridge YAML file.")],
    duration: Annotated[
        str | None,
        typer.Option(help="Stop after this long: 90s, 10m, or seconds (default: until stopped)."),
    ] = None,
    live: Annotated[
        bool | None,
        typer.Option("--live/--no-live", help="Live per-route counters (default: in a terminal)."),
    ] = None,
) -> int:
    """Run every route of CONFIG until SIGTERM or Ctrl-C; then finish what is in flight."""
    cfg = settings(ctx)
    seconds = parse_optional_duration(duration, "--duration", positive=True)
    conf = _load(cfg, config)
    show = sys.stdout.isatty() if live is None else live
    with _logging(cfg):
        bridge = Bridge(conf)
        if not show:
            bridge.run(duration=seconds)
        else:
            with Live(_table(bridge), console=cfg.out, refresh_per_second=2) as view:
                done = threading.Event()

                def refresh() -> None:
                    while not done.wait(0.5):
                        view.update(_table(bridge))

                t = threading.Thread(target=refresh, daemon=True)
                t.start()
                try:
                    bridge.run(duration=seconds)
                finally:
                    done.set()
                    t.join()
                    view.update(_table(bridge))
    failed = [r.route.name for r in bridge.routes if r.failed]
    if failed:
        raise CommandError(f"route(s) failed: {', '.join(failed)} (see the messages above)")
    totals = sum(s.bridged for s in bridge.stats())
    cfg.out.print(f"bridge {conf.bridge.name} stopped: {totals} messages bridged")
    return 0


@bridge_app.command("check")
def check(
    ctx: typer.Context,
    config: Annotated[Path, typer.Argument(help="The bridge YAML file (its health_file).")],
    max_age: Annotated[
        str, typer.Option(help="Oldest acceptable health record: 10s, 1m, or seconds.")
    ] = "10s",
) -> int:
    """Exit 0 if the bridge of CONFIG is alive and no route failed, 1 if not."""
    cfg = settings(ctx)
    age = parse_duration(max_age, "--max-age")
    conf = _load(cfg, config)
    if not conf.bridge.health_file:
        raise CommandError(
            f"bridge config {config} sets no bridge.health_file; add one so the bridge "
            "writes a health record"
        )
    ok, why = check_health(conf.bridge.health_file, max_age=age)
    if not ok:
        raise CommandError(why)
    cfg.out.print(why)
    return 0


def _label(node: Node, asked: str) -> str:
    subs = ", ".join(f"{k}={v}" for k, v in node.subscribers.items()) or "no subscribers"
    mark = "[bold]" if node.msg_id == asked else ""
    end = "[/bold]" if mark else ""
    return (
        f"{mark}{escape(node.msg_id)}{end}  {escape(node.queue)} @ {escape(node.where)}  "
        f"publisher={node.publisher_state}  {escape(subs)}"
    )


def _grow(tree: Tree, node: Node, asked: str) -> None:
    for child in node.children:
        _grow(tree.add(_label(child, asked)), child, asked)


def lineage(
    ctx: typer.Context,
    msg_id: Annotated[str, typer.Argument(help="The message to trace.")],
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", help="A bridge YAML file: search its routes' brokers."),
    ] = None,
) -> int:
    """Print MSG_ID's lineage: its ancestors and descendants across queues and brokers."""
    cfg = settings(ctx)
    with contextlib.ExitStack() as stack:
        if config is not None:
            conf = _load(cfg, config)
            hubs: list[tuple[str, Hub]] = []
            seen: set[tuple[str, str | None]] = set()
            ends = [(r.source.url, r.source.index) for r in conf.routes]
            ends += [(r.destination.url, r.destination.index) for r in conf.routes]
            for url, index in ends:
                if (url, index) not in seen:
                    seen.add((url, index))
                    hub = connect(url, index)
                    stack.callback(hub.close)
                    hubs.append((url, hub))
            state = connect(conf.bridge.state)
            stack.callback(state.close)
            finder = Lineage(hubs, conf.routes, conf.bridge.name, state)
        else:
            hub = stack.enter_context(open_hub(ctx, create=False))
            finder = Lineage([(cfg.url, hub)])
        trees = finder.tree(msg_id)
        if not trees:
            raise CommandError(
                f"no index searched knows message {msg_id}; give the bridge config with "
                "--config, or --url/--index of the store that has it"
            )
        for root in trees:
            tree = Tree(_label(root, msg_id))
            _grow(tree, root, msg_id)
            cfg.out.print(tree)
    return 0
