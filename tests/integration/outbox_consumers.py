"""The consumer process of the outbox kill test: one thread per subscriber, each getting
and finishing messages until the stop file exists and nothing came for a while.

Every delivery handed to a thread is written to the report, so the test counts what
subscribers actually received, not what the index says they did. The report is written
whole and renamed into place.

    python outbox_consumers.py --url URL --index URL --queue Q --out FILE --stop FILE a b p1
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from pathlib import Path

#: A consumer left behind by a broken test still exits on its own after this long.
_MAX_LIFE = 600.0


def main(argv: list[str] | None = None) -> None:
    """Entry point of the consumer process."""
    import iqbridge

    parser = argparse.ArgumentParser(description="outbox kill test consumers")
    parser.add_argument("--url", required=True)
    parser.add_argument("--index")
    parser.add_argument("--queue", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--stop", required=True, help="stop once this file exists and idle")
    parser.add_argument("--idle", type=float, default=1.0, help="seconds idle after stop")
    parser.add_argument("subscribers", nargs="+")
    args = parser.parse_args(argv)
    stop = Path(args.stop)
    got: dict[str, list[list[object]]] = {s: [] for s in args.subscribers}
    errors: list[str] = []
    deadline = time.monotonic() + _MAX_LIFE

    with iqbridge.connect(args.url, index=args.index) as hub:
        queue = hub.queue(args.queue)

        def consume(subscriber: str) -> None:
            idle_since = time.monotonic()
            try:
                while time.monotonic() < deadline:
                    delivery = queue.get(subscriber, timeout=0.2)
                    if delivery is None:
                        if stop.exists() and time.monotonic() - idle_since >= args.idle:
                            return
                        continue
                    with delivery:
                        got[subscriber].append([delivery.msg_id, delivery.attempt])
                    idle_since = time.monotonic()
            except Exception as exc:
                errors.append(f"{subscriber}: {type(exc).__name__}: {exc}")

        threads = [threading.Thread(target=consume, args=(s,)) for s in args.subscribers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    out = Path(args.out)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), "got": got, "errors": errors}))
    tmp.replace(out)


if __name__ == "__main__":
    main()
