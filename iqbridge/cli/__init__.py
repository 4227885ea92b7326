"""The ``iq`` command line: ``iq demo`` runs the main job; ``iq --help`` lists the rest."""

from iqbridge.cli.app import app, main

__all__ = ["app", "main"]
