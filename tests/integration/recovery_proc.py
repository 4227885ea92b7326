"""Runs one cross-queue recovery for the kill test and dies (``os._exit``, no clean-up,
as a SIGKILL would leave it) right after its ``--die-after``-th plan row.

Usage: recovery_proc.py FROM_URL FROM_QUEUE TO_URL TO_QUEUE [--die-after N]
"""

from __future__ import annotations

import os
import sys


def main() -> None:
    import iqbridge
    from iqbridge.recovery.crossqueue import CrossQueueRecovery, PlanRow

    args = sys.argv[1:]
    die_after = None
    if "--die-after" in args:
        i = args.index("--die-after")
        die_after = int(args[i + 1])
        del args[i : i + 2]
    src_url, src_q, dst_url, dst_q = args
    rows = 0

    def on_row(row: PlanRow, applied: bool) -> None:
        nonlocal rows
        rows += 1
        print(f"{row.action} {row.msg_id} {row.subscriber or '-'} {applied}", flush=True)
        if die_after is not None and rows >= die_after:
            os._exit(9)

    with iqbridge.connect(src_url) as a, iqbridge.connect(dst_url) as b:
        job = CrossQueueRecovery(a.queue(src_q), b.queue(dst_q))
        result = job.apply(on_row=on_row)
    print(f"done {result.run} {result.applied} {result.already}", flush=True)


if __name__ == "__main__":
    main()
