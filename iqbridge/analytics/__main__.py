"""``python -m iqbridge.analytics JOB …`` and ``spark-submit …/__main__.py JOB …``.

The same commands as ``iq analytics JOB …`` (see :mod:`iqbridge.cli.analytics`).
"""

import sys

from iqbridge.cli.app import app


def main() -> None:
    """Run ``iq analytics`` with this process's arguments."""
    app(["analytics", *sys.argv[1:]], prog_name="iqbridge.analytics")


if __name__ == "__main__":
    main()
