"""Shared by the reconciliation tests: a report's findings, compared and picked."""

from __future__ import annotations

from iqbridge.recovery.reconcile import Finding, Kind, Report


def kinds(report: Report) -> list[tuple[Kind, str | None, str | None, bool]]:
    """The findings as (kind, msg_id, group, repaired), sorted."""
    return sorted(
        ((f.kind, f.msg_id, f.group, f.repaired) for f in report.findings),
        key=lambda t: (t[0].value, t[1] or "", t[2] or ""),
    )


def one(report: Report, kind: Kind) -> Finding:
    """The one finding of ``kind`` (the test fails if there are more or none)."""
    found = [f for f in report.findings if f.kind is kind]
    assert len(found) == 1, report.findings
    return found[0]
