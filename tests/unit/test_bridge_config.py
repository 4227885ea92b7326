"""The bridge's configuration and translation: validated on load with errors naming the
route, the field and the problem; secrets from the environment never shown; envelope,
header and content-type mapping; user transforms; deterministic child ids."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import iqbridge
from iqbridge import ConfigurationError, Outgoing, PayloadError
from iqbridge.bridge import Bridge, BridgeMessage, child_id, load_config, parse_config
from iqbridge.bridge.translate import Translator


def _raw(**route: object) -> dict[str, object]:
    base: dict[str, object] = {
        "name": "orders",
        "source": {"url": "sqlite:///in.db", "queue": "orders"},
        "destination": {"url": "sqlite:///out.db", "queue": "orders"},
    }
    base.update(route)
    return {"routes": [base]}


def test_a_minimal_config_has_the_documented_defaults() -> None:
    cfg = parse_config(_raw())
    r = cfg.routes[0]
    assert (r.workers, r.batch, r.source.subscriber, r.content_type) == (4, 200, "bridge", "keep")
    assert cfg.bridge.state == "sqlite:///iq-bridge-state.db"


@pytest.mark.parametrize(
    ("route", "expected"),
    [
        (
            {"workers": 0},
            "route 'orders', field workers: Input should be greater than or equal to 1",
        ),
        ({"source": {"url": "x", "queue": "bad name"}}, "route 'orders', field source.queue"),
        ({"destination": {"url": "x"}}, "route 'orders', field destination.queue: Field required"),
        ({"transform": "no-colon"}, "route 'orders', field transform"),
        ({"correlate": {"key": "correlation_id"}}, "give count, complete or timeout"),
        ({"envelope": {"priority": 12}}, "route 'orders', field envelope.priority"),
        ({"content_type": "xml"}, "route 'orders', field content_type"),
        ({"surprise": 1}, "route 'orders', field surprise: Extra inputs are not permitted"),
    ],
)
def test_errors_name_the_route_the_field_and_the_problem(
    route: dict[str, object], expected: str
) -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_config(_raw(**route))
    assert expected in str(info.value)


def test_an_unnamed_route_is_named_by_its_position_and_names_are_unique() -> None:
    with pytest.raises(ConfigurationError, match=r"route #1, field name: Field required"):
        parse_config(
            {
                "routes": [
                    {
                        "source": {"url": "x", "queue": "q"},
                        "destination": {"url": "y", "queue": "q"},
                    }
                ]
            }
        )
    twice = _raw()
    twice["routes"] = [twice["routes"][0], twice["routes"][0]]  # type: ignore[index]
    with pytest.raises(ConfigurationError, match="used twice"):
        parse_config(twice)


def test_secrets_come_from_the_environment_and_never_show(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RABBIT_PW", "s3cr3t-pw")
    raw = _raw(workers="many")
    raw["routes"][0]["destination"] = {  # type: ignore[index]
        "url": "amqp://guest:${RABBIT_PW}@127.0.0.1/%2F",
        "queue": "orders",
    }
    with pytest.raises(ConfigurationError) as info:
        parse_config(raw)
    assert "s3cr3t-pw" not in str(info.value) and "field workers" in str(info.value)
    raw["routes"][0]["workers"] = 2  # type: ignore[index]
    cfg = parse_config(raw)
    assert cfg.routes[0].destination.url == "amqp://guest:s3cr3t-pw@127.0.0.1/%2F"
    assert cfg.secrets() == ["s3cr3t-pw"]


def test_secrets_are_those_of_every_url_option_too() -> None:
    """Secret options (not only user-part passwords) of every URL, index ones included,
    are what the bridge's log lines, errors and health record are scrubbed of."""
    cfg = parse_config(
        _raw(
            source={"url": "sqlite:///in.db", "queue": "orders", "index": "memory://"},
            destination={
                "url": "kafka://h:9092?sasl.password=Kafka-Pw1&client.id=bridge",
                "index": "postgresql://iq@db/shop?sslpassword=Pg-Key-Pw2&schema=iq",
                "queue": "orders",
            },
        )
    )
    assert {"Kafka-Pw1", "Pg-Key-Pw2"} <= set(cfg.secrets())
    assert not {"bridge", "iq", "shop"} & set(cfg.secrets())


def test_a_missing_environment_variable_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOPE_PW", raising=False)
    raw = _raw()
    raw["routes"][0]["source"]["url"] = "redis://:${NOPE_PW}@h/0"  # type: ignore[index]
    with pytest.raises(ConfigurationError, match="NOPE_PW not set"):
        parse_config(raw)


def test_load_config_reports_bad_yaml_and_missing_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="cannot read bridge config"):
        load_config(tmp_path / "none.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("routes: [\n  - name: x\n    source: {url: \n")
    with pytest.raises(ConfigurationError, match=r"not valid YAML at line \d"):
        load_config(bad)
    empty = tmp_path / "empty.yaml"
    empty.write_text("routes: []\n")
    with pytest.raises(ConfigurationError, match="field routes"):
        load_config(empty)


def _msg(body: bytes = b'{"a": 1}', ctype: str = "application/json", **kw: object) -> BridgeMessage:
    fields: dict[str, object] = {
        "msg_id": "m1",
        "queue": "orders",
        "body": body,
        "content_type": ctype,
        "headers": {"old": "1", "drop-me": "x", "tenant": "t7"},
        "correlation_id": "c1",
        "priority": 6,
        "ordering_key": "k1",
        "publisher": "shop",
    }
    fields.update(kw)
    return BridgeMessage(**fields)  # type: ignore[arg-type]


def test_headers_and_envelope_are_mapped() -> None:
    route = parse_config(
        _raw(
            headers={"rename": {"old": "new"}, "drop": ["drop-me"], "set": {"via": "bridge"}},
            envelope={"ordering_key": "header:tenant", "correlation_id": "msg_id", "priority": 2},
        )
    ).routes[0]
    [child] = Translator(route).children(_msg())
    assert child.headers == {"new": "1", "tenant": "t7", "via": "bridge"}
    assert (child.ordering_key, child.correlation_id, child.priority) == ("t7", "m1", 2)
    assert child.parents == ("m1",) and child.msg_id == child_id("orders", ("m1",), 0)
    assert child.publisher == "bridge.orders"


@pytest.mark.parametrize(
    ("target", "body", "ctype", "out", "out_ctype"),
    [
        ("text", b'{"a": 1}', "application/json", b'{"a": 1}', "text/plain; charset=utf-8"),
        ("json", b'{"a": 1}', "text/plain; charset=utf-8", b'{"a": 1}', "application/json"),
        ("json", b"plain words", "text/plain; charset=utf-8", b'"plain words"', "application/json"),
        ("bytes", b"\x00\x01", "application/octet-stream", b"\x00\x01", "application/octet-stream"),
    ],
)
def test_content_types_convert(
    target: str, body: bytes, ctype: str, out: bytes, out_ctype: str
) -> None:
    route = parse_config(_raw(content_type=target)).routes[0]
    [child] = Translator(route).children(_msg(body, ctype))
    assert child.payload == out and child.content_type == out_ctype


def test_conversions_that_cannot_work_are_payload_errors() -> None:
    to_text = Translator(parse_config(_raw(content_type="text")).routes[0])
    with pytest.raises(PayloadError, match="not UTF-8"):
        to_text.children(_msg(b"\xff\xfe", "application/octet-stream"))
    to_json = Translator(parse_config(_raw(content_type="json")).routes[0])
    with pytest.raises(PayloadError, match="cannot be converted to JSON"):
        to_json.children(_msg(b"\x00", "application/octet-stream"))
    with pytest.raises(PayloadError, match="not valid JSON"):
        to_json.children(_msg(b"{nope", "application/json"))


# Transforms used through their dotted paths below.
def split_items(msg: BridgeMessage) -> object:
    items = msg.payload["items"]
    if not items:
        return None
    return [
        Outgoing({"item": i}, ordering_key=f"item-{i}") if i % 2 else {"item": i} for i in items
    ]


def as_list(msg: BridgeMessage) -> object:
    return Outgoing([1, 2, 3])


def test_a_transform_filters_splits_and_overrides() -> None:
    route = parse_config(_raw(transform=f"{__name__}:split_items")).routes[0]
    tr = Translator(route)
    assert tr.children(_msg(json.dumps({"items": []}).encode())) == []
    kids = tr.children(_msg(json.dumps({"items": [1, 2]}).encode()))
    assert [k.payload for k in kids] == [{"item": 1}, {"item": 2}]
    assert [k.ordering_key for k in kids] == ["item-1", "k1"]  # its own, else the parent's
    assert [k.msg_id for k in kids] == [child_id("orders", ("m1",), n) for n in (0, 1)]
    assert all(k.parents == ("m1",) and k.correlation_id == "c1" for k in kids)
    [one] = Translator(parse_config(_raw(transform=f"{__name__}:as_list")).routes[0]).children(
        _msg()
    )
    assert one.payload == [1, 2, 3]


def test_a_transform_that_cannot_be_imported_is_a_configuration_error() -> None:
    with pytest.raises(
        ConfigurationError, match=r"route 'orders', field transform 'nowhere\.mod:fn'"
    ):
        Translator(parse_config(_raw(transform="nowhere.mod:fn")).routes[0])
    with pytest.raises(ConfigurationError, match="has no function 'missing'"):
        Translator(parse_config(_raw(transform=f"{__name__}:missing")).routes[0])


def test_child_ids_are_deterministic_and_distinct() -> None:
    a = child_id("r", ("p1",), 0)
    assert a == child_id("r", ("p1",), 0)
    assert (
        len({a, child_id("r", ("p1",), 1), child_id("r2", ("p1",), 0), child_id("r", ("p2",), 0)})
        == 4
    )
    assert child_id("r", ("a", "b")) != child_id("r", ("ab",))


@pytest.mark.parametrize(
    ("end", "key", "url", "error", "says"),
    [
        (
            "source",
            "url",
            "sqlit:///in.db",
            ConfigurationError,
            "route 'orders', field source.url: unknown URL scheme 'sqlit'; did you mean 'sqlite'?",
        ),
        (
            "destination",
            "index",
            "foo://",
            ConfigurationError,
            "route 'orders', field destination.index: unknown URL scheme 'foo'",
        ),
        (
            "destination",
            "url",
            "redis://:pw-s3cret@127.0.0.1:1/0",
            iqbridge.ConnectionError,
            "route 'orders', field destination.url: cannot reach Redis at redis://:***@",
        ),
        (
            "bridge",
            "state",
            "nope",
            ConfigurationError,
            "field bridge.state: broker URL 'nope' has no scheme",
        ),
    ],
)
def test_a_url_the_bridge_cannot_open_names_the_route_and_the_field(
    tmp_path: Path, end: str, key: str, url: str, error: type[Exception], says: str
) -> None:
    """Issue 27, point 14: docs/bridge.md says every error names the route and the field."""
    raw: dict[str, Any] = {
        "bridge": {"state": f"sqlite:///{tmp_path}/state.db"},
        "routes": [
            {
                "name": "orders",
                "source": {"url": f"sqlite:///{tmp_path}/in.db", "queue": "orders"},
                "destination": {"url": f"sqlite:///{tmp_path}/out.db", "queue": "orders"},
            }
        ],
    }
    (raw["bridge"] if end == "bridge" else raw["routes"][0][end])[key] = url
    with pytest.raises(error) as err:
        Bridge(parse_config(raw))
    assert str(err.value).startswith(says), str(err.value)
    assert "s3cret" not in str(err.value)
