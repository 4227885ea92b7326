"""The latency job's HTML report: tables and matplotlib plots in one self-contained file.

Plots are inline SVG (no network, no image files beside the page); every name from the
journal is HTML-escaped, in the tables and in the plots' labels alike.
"""

from __future__ import annotations

import html
import io
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = ["write_latency_report"]

_MAX_BARS = 30


def _label(row: dict[str, Any]) -> str:
    return f"{row['queue']} / {row['actor']}"


def _svg(fig: Any) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    text = buf.getvalue()
    # Drop the XML prolog and DOCTYPE: the SVG element is embedded in HTML.
    return text[text.index("<svg") :]


def _percentile_plot(rows: list[dict[str, Any]]) -> str:
    import matplotlib.pyplot as plt

    top = sorted(rows, key=lambda r: (-int(r["done"]), _label(r)))[:_MAX_BARS]
    fig, ax = plt.subplots(figsize=(9, 0.45 * max(len(top), 2) + 1.2))
    try:
        labels = [_label(r) for r in top]
        ys = list(range(len(top)))
        h = 0.27
        for i, (col, name) in enumerate((("p50_ms", "p50"), ("p95_ms", "p95"), ("p99_ms", "p99"))):
            ax.barh([y + (i - 1) * h for y in ys], [float(r[col]) for r in top], h, label=name)
        ax.set_yticks(ys, labels)
        ax.invert_yaxis()
        ax.set_xlabel("REVEALED to DONE (ms)")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1))
        ax.set_title("Latency per queue and subscriber")
        return _svg(fig)
    finally:
        plt.close(fig)


def _states_plot(rows: list[dict[str, Any]], order: list[str]) -> str:
    import matplotlib.pyplot as plt

    by: dict[str, dict[str, float]] = defaultdict(dict)
    for r in rows:
        by[_label(r)][str(r["state"])] = float(r["mean_ms"])
    labels = sorted(by)[:_MAX_BARS]
    fig, ax = plt.subplots(figsize=(9, 0.45 * max(len(labels), 2) + 1.2))
    try:
        left = [0.0] * len(labels)
        for state in order:
            if state == "JOURNALLED":
                continue  # the rest of time: a finished message stays JOURNALLED
            widths = [by[lab].get(state, 0.0) for lab in labels]
            if any(widths):
                ax.barh(labels, widths, left=left, label=state)
                left = [a + b for a, b in zip(left, widths, strict=True)]
        ax.invert_yaxis()
        ax.set_xlabel("mean time in state per message (ms)")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
        ax.set_title("Where the time goes")
        return _svg(fig)
    finally:
        plt.close(fig)


def _throughput_plot(rows: list[dict[str, Any]]) -> str:
    import matplotlib.pyplot as plt

    series: dict[str, dict[datetime, int]] = defaultdict(lambda: defaultdict(int))
    for r in rows:
        series[str(r["queue"])][r["hour"]] += int(r["done"])
    fig, ax = plt.subplots(figsize=(9, 3.5))
    try:
        for queue in sorted(series, key=lambda q: -sum(series[q].values()))[:10]:
            points = sorted(series[queue].items())
            xs: Any = [p[0] for p in points]
            ax.plot(xs, [p[1] for p in points], marker="o", label=queue)
        ax.set_ylabel("DONE per hour")
        ax.set_title("Throughput per queue (all subscribers)")
        if series:
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
        fig.autofmt_xdate()
        return _svg(fig)
    finally:
        plt.close(fig)


def _table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = []
    for r in rows:
        cells = []
        for c in columns:
            v = r.get(c)
            text = f"{v:,.1f}" if isinstance(v, float) else "" if v is None else str(v)
            cells.append(f"<td>{html.escape(text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


_STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:14px}
th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f3f3f3} td:first-child,td:nth-child(2),td:nth-child(3){text-align:left}
svg{max-width:100%;height:auto}
"""


def write_latency_report(
    path: str | Path,
    percentiles: list[dict[str, Any]],
    states: list[dict[str, Any]],
    throughput: list[dict[str, Any]],
) -> str:
    """Write the report to ``path`` (a local path, or a URI pyarrow's file systems
    know: ``s3://``, ``hdfs://``, ``file://``...) and return it."""
    import matplotlib

    matplotlib.use("Agg")
    from iqbridge.analytics.schema import SUBSCRIBER_STATES

    order = list(SUBSCRIBER_STATES)
    states = sorted(states, key=lambda r: (_label(r), order.index(str(r["state"]))))
    made = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        "<title>iqbridge latency report</title>",
        f"<style>{_STYLE}</style></head><body>",
        "<h1>iqbridge latency report</h1>",
        f"<p>Made {html.escape(made)} from the exported journal.</p>",
        "<h2>REVEALED to DONE</h2>",
        _percentile_plot(percentiles) if percentiles else "<p>No message reached DONE.</p>",
        _table(
            percentiles,
            ["store", "queue", "actor", "done", "p50_ms", "p95_ms", "p99_ms", "mean_ms", "max_ms"],
        ),
        "<h2>Time in each state</h2>",
        _states_plot(states, order) if states else "<p>No transitions.</p>",
        _table(
            states, ["store", "queue", "actor", "state", "messages", "mean_ms", "p95_ms", "total_s"]
        ),
        "<h2>Throughput</h2>",
        _throughput_plot(throughput) if throughput else "<p>No message reached DONE.</p>",
        _table(
            sorted(throughput, key=lambda r: (str(r["queue"]), str(r["actor"]), r["hour"])),
            ["store", "queue", "actor", "hour", "done"],
        ),
        "</body></html>",
    ]
    text = "\n".join(parts)
    if "://" in str(path):  # s3://, hdfs://, file://...: where Spark wrote the tables
        from pyarrow import fs

        filesystem, where = fs.FileSystem.from_uri(str(path))
        filesystem.create_dir(where.rsplit("/", 1)[0], recursive=True)
        with filesystem.open_output_stream(where) as out:
            out.write(text.encode("utf-8"))
        return str(path)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")
    return str(target)
