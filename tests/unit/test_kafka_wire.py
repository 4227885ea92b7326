"""The Kafka adapter's wire format: an envelope survives the trip through a record's key,
value and headers; a stranger's record is adopted under a stable id."""

from __future__ import annotations

from iqbridge.adapters.kafka_wire import addressed_to, decode, encode, parse_ref, ref
from iqbridge.ids import adopted_id
from iqbridge.model import Envelope


def test_an_envelope_round_trips_through_key_value_and_headers() -> None:
    env = Envelope(
        msg_id="m-1",
        body=b"\x00\xffpayload",
        content_type="application/json",
        headers={"tenant": "eu", "iq-id": "the application's own", "iq-h-x": "y"},
        publisher="billing",
        correlation_id="c-9",
        priority=7,
        ordering_key="cust-9",
        parents=("p-1", "p-2"),
        put_at=1_800_000_000_123_456,
        groups=("a", "pool"),
        expires_at=1_800_000_060_000_000,
    )
    key, headers = encode(env)
    assert key == b"cust-9"
    assert addressed_to(headers) == ["a", "pool"]
    back, adopted = decode("t", 0, 5, key, env.body, headers, 0)
    assert not adopted
    assert back == env


def test_no_ordering_key_no_record_key_and_no_audience_header() -> None:
    key, headers = encode(Envelope(msg_id="m", body=b"x"))
    assert key is None
    assert addressed_to(headers) is None


def test_a_strangers_record_is_adopted_under_topic_partition_and_offset() -> None:
    headers = [("content-type", b"text/plain"), ("trace", None)]
    env, adopted = decode("orders", 2, 41, b"k", b"hello", headers, 1_800_000_000_000)
    assert adopted
    assert env.msg_id == adopted_id("kafka", "orders", "2:41")
    assert (env.body, env.content_type, env.ordering_key) == (b"hello", "text/plain", "k")
    assert env.headers == {"content-type": "text/plain", "trace": ""}
    assert env.publisher == "(legacy)"
    assert env.put_at == 1_800_000_000_000_000
    again, _ = decode("orders", 2, 41, None, None, None, -1)
    assert again.msg_id == env.msg_id and again.body == b""


def test_native_references() -> None:
    assert ref(3, 17) == "3:17"
    assert parse_ref("3:17") == (3, 17)


def test_malformed_iq_headers_do_not_stop_the_reader() -> None:
    headers = [("iq-id", b"m"), ("iq-to", b"{not json"), ("iq-parents", b"7"), ("iq-prio", b"x")]
    assert addressed_to(headers) is None  # for every group: the index decides
    env, adopted = decode("t", 0, 1, None, b"v", headers, 0)
    assert not adopted
    assert (env.msg_id, env.groups, env.parents, env.priority) == ("m", (), (), 4)
