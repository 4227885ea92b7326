"""The ``iq`` application: global options, command registry and one-line error reporting.

Errors never end in a traceback (unless ``--debug``): an :class:`~iqbridge.errors.IQError`
or a command's own failure prints ``iq: error: <message>`` and exits 1; bad usage
prints one line and exits 2; anything unexpected names the exception type and exits 1.
Passwords of the URLs given are scrubbed from every message.
"""

import sys
import traceback
from collections.abc import Sequence
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from iqbridge.cli import admin, demo, looking, messages, reconcile, relay, run_worker
from iqbridge.cli.admin_serve import admin_app
from iqbridge.cli.analytics import analytics_app
from iqbridge.cli.bridge import bridge_app, lineage
from iqbridge.cli.context import CommandError, Settings, settings
from iqbridge.cli.helptext import tidy_help
from iqbridge.cli.journal import journal_app
from iqbridge.errors import IQError
from iqbridge.hub import DEFAULT_URL
from iqbridge.redaction import scrub

__all__ = ["app", "main"]


def _click_exception_type() -> type[Exception]:
    # Typer re-exports BadParameter whether it vendors click or depends on it; its base
    # ClickException is what every usage error derives from.
    for cls in typer.BadParameter.__mro__:
        if cls.__name__ == "ClickException":
            return cls
    return typer.BadParameter


_CLICK_ERROR = _click_exception_type()


class IQGroup(TyperGroup):
    """The root command: runs the command line and turns every failure into one line."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        if not isinstance(extra.get("obj"), Settings):
            extra["obj"] = Settings()
        cfg: Settings = extra["obj"]
        try:
            rv = super().main(
                args=args,
                prog_name=prog_name or "iq",
                complete_var=complete_var,
                standalone_mode=False,
                windows_expand_args=windows_expand_args,
                **extra,
            )
            code = rv if isinstance(rv, int) else 0
        except KeyboardInterrupt:
            _say(cfg, "interrupted")
            code = 130
        except typer.Abort:
            _say(cfg, "aborted")
            code = 1
        except (CommandError, IQError) as exc:
            code = _report(cfg, exc, str(exc))
        except Exception as exc:
            if isinstance(exc, _CLICK_ERROR):
                code = _usage(cfg, exc)
            else:
                why = f"unexpected {type(exc).__name__}: {exc}"
                code = _report(cfg, exc, why + " (run with --debug for the traceback)")
        if standalone_mode:
            sys.exit(code)
        return code

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        tidy_help(self, ctx)  # before --help can print anything
        return super().parse_args(ctx, args)


def _scrub(cfg: Settings, text: str) -> str:
    return " ".join(scrub(text, cfg.secrets()).split())


def _say(cfg: Settings, text: str) -> None:
    print(f"iq: error: {_scrub(cfg, text)}", file=sys.stderr, flush=True)


def _report(cfg: Settings, exc: BaseException, text: str) -> int:
    if cfg.debug:
        trace = "".join(traceback.format_exception(exc))
        print(scrub(trace, cfg.secrets()), file=sys.stderr, end="", flush=True)
    _say(cfg, text)
    return 1


def _usage(cfg: Settings, exc: Exception) -> int:
    fmt = getattr(exc, "format_message", None)
    text = str(fmt() if callable(fmt) else exc)
    ctx = getattr(exc, "ctx", None)
    path = getattr(ctx, "command_path", None)
    if path:
        text = f"{text.rstrip()} (see: {path} --help)"
    _say(cfg, text)
    code = getattr(exc, "exit_code", 2)
    return code if isinstance(code, int) else 2


app = typer.Typer(
    name="iq",
    cls=IQGroup,
    help="iqbridge: one message-state model over many brokers. Start with: iq demo",
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback(invoke_without_command=True)
def _root(
    ctx: typer.Context,
    url: Annotated[
        str, typer.Option("--url", envvar="IQ_URL", help="Broker URL.", show_envvar=True)
    ] = DEFAULT_URL,
    index: Annotated[
        str | None,
        typer.Option("--index", envvar="IQ_INDEX", help="Index store URL (default: the broker's)."),
    ] = None,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks on errors.")] = False,
) -> None:
    cfg = settings(ctx)
    cfg.url, cfg.index, cfg.debug = url, index, debug
    if ctx.invoked_subcommand is None:
        typer.echo(ctx.get_help())


_MESSAGES = "Messages"
_LOOKING = "Looking"
_ADMIN = "Queues and workers"

app.command("demo", rich_help_panel="Start here")(demo.demo)
app.command("put", rich_help_panel=_MESSAGES)(messages.put)
app.command("get", rich_help_panel=_MESSAGES)(messages.get)
app.command("confirm", rich_help_panel=_MESSAGES)(messages.confirm)
app.command("undo", rich_help_panel=_MESSAGES)(messages.undo)
app.command("withdraw", rich_help_panel=_MESSAGES)(messages.withdraw)
app.command("reveal", rich_help_panel=_MESSAGES)(messages.reveal)
app.command("state", rich_help_panel=_LOOKING)(looking.state)
app.command("search", rich_help_panel=_LOOKING)(looking.search)
app.command("browse", rich_help_panel=_LOOKING)(looking.browse)
app.command("unlock", rich_help_panel=_LOOKING)(looking.unlock)
app.command("purge", rich_help_panel=_ADMIN)(looking.purge)
app.command("subscribe", rich_help_panel=_ADMIN)(admin.subscribe)
app.command("unsubscribe", rich_help_panel=_ADMIN)(admin.unsubscribe)
app.command("queues", rich_help_panel=_ADMIN)(admin.queues)
app.command("recover", rich_help_panel=_ADMIN)(admin.recover)
app.command("worker", rich_help_panel=_ADMIN)(run_worker.worker)
app.command("relay", rich_help_panel=_ADMIN)(relay.relay)
app.command("reconcile", rich_help_panel=_ADMIN)(reconcile.reconcile)
app.add_typer(bridge_app, name="bridge", rich_help_panel=_ADMIN)
app.add_typer(journal_app, name="journal", rich_help_panel=_ADMIN)
app.add_typer(analytics_app, name="analytics", rich_help_panel=_ADMIN)
app.add_typer(admin_app, name="admin", rich_help_panel=_ADMIN)
app.command("lineage", rich_help_panel=_LOOKING)(lineage)


def main() -> None:
    """Console-script entry point (``iq``)."""
    app()
