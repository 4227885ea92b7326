"""The ``iq`` command line."""


def main() -> None:
    """Entry point placeholder replaced by the CLI module."""
    raise SystemExit("iq CLI not built yet")
