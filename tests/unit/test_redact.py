"""``redact``: a URL's password becomes ``***``, whatever else the URL holds."""

from __future__ import annotations

import pytest

from iqbridge.registry import redact


@pytest.mark.parametrize(
    ("url", "safe"),
    [
        ("amqp://guest:guest@127.0.0.1:5672/%2F", "amqp://guest:***@127.0.0.1:5672/%2F"),
        ("redis://:s3cret@[::1]:6379/0?prefix=a", "redis://:***@[::1]:6379/0?prefix=a"),
        ("oracle+aq://app:pw@db:99999/FREEPDB1", "oracle+aq://app:***@db:99999/FREEPDB1"),
        (
            "ibmmq://app@mq:1414/QM1?channel=DEV.APP.SVRCONN",
            "ibmmq://app@mq:1414/QM1?channel=DEV.APP.SVRCONN",
        ),
        ("sqlite:///tmp/x.db", "sqlite:///tmp/x.db"),
        ("http://[::1", "<unparseable URL>"),
    ],
)
def test_redact(url: str, safe: str) -> None:
    assert redact(url) == safe
