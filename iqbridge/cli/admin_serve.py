"""``iq admin serve``: the admin API and dashboard over the hubs of a config file.

FastAPI and uvicorn are imported only when the command runs, so ``iq`` works without
the ``admin`` extra; without it the command says what to install.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from typing import Annotated

import typer

from iqbridge.cli.context import CommandError, settings
from iqbridge.redaction import get_logger

__all__ = ["admin_app", "serve"]

admin_app = typer.Typer(
    help="The admin API and dashboard over many hubs (see docs/admin.md).",
    no_args_is_help=True,
)

_NEEDS = ("fastapi", "uvicorn", "jinja2", "multipart")


@admin_app.command("serve")
def serve(
    ctx: typer.Context,
    config: Annotated[
        Path, typer.Option("--config", "-c", help="The hubs.yaml file: tokens, hubs, bridges.")
    ],
    host: Annotated[
        str | None, typer.Option("--host", help="Listen address (default: the file's listen.host).")
    ] = None,
    port: Annotated[
        int | None,
        typer.Option("--port", min=1, max=65535, help="Port (default: the file's listen.port)."),
    ] = None,
) -> None:
    """Serve the admin API (/api, /docs) and the dashboard (/ui) until interrupted."""
    missing = [m for m in _NEEDS if importlib.util.find_spec(m) is None]
    if missing:
        raise CommandError(
            f"the admin server needs {', '.join(missing)}: install iqbridge[admin] "
            f"(pip install 'iqbridge[admin]')"
        )
    import uvicorn

    from iqbridge.admin import create_app, load_config
    from iqbridge.admin.server import server_config

    cfg = load_config(config)
    app = create_app(cfg)
    state = app.state.admin
    settings(ctx).more_secrets.extend([*state.tokens.secrets(), *state.service.hubs.secrets()])
    server = uvicorn.Server(server_config(app, cfg, host=host, port=port))
    _log_to_stderr()
    server.run()


def _log_to_stderr() -> None:
    """iqbridge's log lines (actions by token name, unreachable hubs) beside uvicorn's."""
    log = get_logger("iqbridge")
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)-9s %(name)s: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
