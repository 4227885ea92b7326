"""The admin API against its own OpenAPI document: schemathesis generates requests for
every operation (in process, over ASGI, with the admin token) and no answer may be a
server error. Bounded: 25 derandomized examples per operation as generated, and 25 more
with the path pinned to the real hub and queue (random names mostly end at 404)."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error

import iqbridge
from tests.integration.admin_helpers import AUTH, DOWN_URL, make_app

pytestmark = pytest.mark.timeout(300)

MAX_EXAMPLES = 25


def _pinned(case: schemathesis.Case) -> schemathesis.Case:
    """The case on the real hub and queue, so generated filters and bodies reach the
    index and the state engine."""
    params = case.path_parameters
    if params is not None:
        if "hub" in params:
            params["hub"] = "sales"
        if "queue" in params:
            params["queue"] = "orders"
    return case


def _unreachable_hub_named(response: Any) -> bool:
    """A 503 that says the unreachable hub of the config is unreachable (any other
    server error still fails the test)."""
    if response.status_code != 503:
        return False
    try:
        body = response.json()
    except ValueError:
        return False
    return body.get("error") == "unavailable" and "'down'" in str(body.get("detail", ""))


def test_no_operation_answers_a_server_error(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'sales.db'}"
    with iqbridge.connect(url) as hub:
        q = hub.queue("orders")
        q.subscribe("billing")
        for i in range(3):
            q.put({"n": i}, correlation_id=f"c-{i}")
        got = q.get("billing")
        assert got is not None
        got.unusable("poison")
    app = make_app(tmp_path, {"sales": url, "down": DOWN_URL})
    schema = schemathesis.openapi.from_asgi("/openapi.json", app, headers=AUTH)
    examples = 0
    failures: list[str] = []
    statuses: Counter[int] = Counter()

    def fuzz(strategy: Any) -> None:
        @given(case=strategy)
        @settings(
            max_examples=MAX_EXAMPLES,
            derandomize=True,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def run(case: schemathesis.Case) -> None:
            nonlocal examples
            examples += 1
            response = case.call(headers=AUTH)
            statuses[response.status_code] += 1
            if _unreachable_hub_named(response):
                return  # the configured hub "down" is down: 503 naming it is the answer
            try:
                case.validate_response(response, checks=[not_a_server_error])
            except Exception as exc:  # a failed check: recorded, reported below
                failures.append(f"{case.method} {case.formatted_path}: {exc}")

        run()

    started = time.monotonic()
    operations = [result.ok() for result in schema.get_all_operations()]
    for operation in operations:
        fuzz(operation.as_strategy())
        fuzz(operation.as_strategy().map(_pinned))
    took = time.monotonic() - started
    print(
        f"\nschemathesis: {len(operations)} operations, {examples} examples, "
        f"{len(failures)} failures in {took:.1f} s; statuses {dict(sorted(statuses.items()))}"
    )
    assert len(operations) == 12
    assert examples >= len(operations) * 2
    assert not failures, "\n".join(failures[:10])
