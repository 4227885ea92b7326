"""One redaction policy (:mod:`iqbridge.redaction`): a URL's password and every secret
option of every broker and index store are ``***`` wherever a URL is shown, the rest of
the URL stays readable, :func:`url_secrets` lists every secret value for scrubbing, no
URL error of any adapter or store quotes one, and every log line of the package is
scrubbed."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from urllib.parse import quote

import pytest

from iqbridge.adapters import ibmmq_wire, kafka_url, oracle_aq, rabbitmq_url, redis_streams
from iqbridge.errors import ConfigurationError, IQError
from iqbridge.redaction import (
    MASK,
    SecretFilter,
    get_logger,
    is_secret_option,
    redact,
    remember,
    scrub,
    url_secrets,
)
from iqbridge.registry import redact as registry_redact
from iqbridge.stores import redis as redis_store
from iqbridge.stores import sql_schema, sqlite_database

ROOT = Path(__file__).resolve().parents[2]
SECRET = "S3CRETXYZ-4f1b"


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
        ("memory://", "memory://"),
        ("http://[::1", "<unparseable URL>"),
        (
            "kafka://127.0.0.1:1?sasl.password=S3CRETXYZ&sasl.username=u"
            "&security.protocol=SASL_PLAINTEXT&sasl.mechanism=PLAIN",
            "kafka://127.0.0.1:1?sasl.password=***&sasl.username=u"
            "&security.protocol=SASL_PLAINTEXT&sasl.mechanism=PLAIN",
        ),
        (
            "kafka://app:pw@h1:9092,h2:9092?ssl.key.password=k&ssl.ca.location=/ca.pem",
            "kafka://app:***@h1:9092,h2:9092?ssl.key.password=***&ssl.ca.location=/ca.pem",
        ),
        (
            "postgresql://iq@db:5432/shop?password=p%21w&sslmode=require&schema=iq",
            "postgresql://iq@db:5432/shop?password=***&sslmode=require&schema=iq",
        ),
        # A password holding an unescaped # or / is still masked whole.
        ("redis://:ab#cd@host:6379/0", "redis://:***@host:6379/0"),
        ("redis://:ab/cd@host:6379/0", "redis://:***@host:6379/0"),
        ("sqlite:///db.sqlite?password=x#y", "sqlite:///db.sqlite?password=***"),
    ],
)
def test_redact(url: str, safe: str) -> None:
    assert redact(url) == safe
    assert registry_redact(url) == safe  # the old import path is the same function


# --- every adapter's and store's own options ------------------------------------------

#: Every option an adapter or a store reads from its URL, and whether its value is
#: secret. A new option fails test_every_option_is_classified until it is listed here.
OWN: dict[str, tuple[str, frozenset[str], set[str]]] = {
    # kind: (a URL of that kind, the options its module reads, the secret ones)
    "kafka": ("kafka://127.0.0.1:9092", kafka_url._OWN_OPTIONS, set()),
    "rabbitmq": (
        "amqp://guest@127.0.0.1:5672/%2F",
        rabbitmq_url._OWN_OPTIONS | rabbitmq_url._PIKA_OPTIONS,
        {"ssl_options"},  # a dict literal that may hold the client key's password
    ),
    "redis_streams": ("redis://127.0.0.1:6379/0", redis_streams._OPTIONS, set()),
    "ibmmq": ("ibmmq://app@mq:1414/QM1", ibmmq_wire._OPTIONS, set()),
    "oracle_aq": ("oracle+aq://app@db:1521/FREEPDB1", frozenset(oracle_aq._OPTIONS), set()),
    "sqlite": ("sqlite:///q.db", sqlite_database.OPTIONS, set()),
    "memory": ("memory://m", frozenset({"forget"}), set()),
    "redis_store": (
        "redis://127.0.0.1:6379/0",
        redis_store._OWN_OPTIONS | redis_store._DRIVER_OPTIONS,
        set(),
    ),
    "sql_store": ("postgresql://iq@db:5432/shop", frozenset(sql_schema._OWN), set()),
}
#: The classification each own option is tested against.
CLASSIFIED = {
    "kafka": {
        "prefix", "partitions", "replication", "retry_for", "connect_timeout",
        "join_timeout", "buffer", "revoke_wait",
    },
    "rabbitmq": {
        "prefix", "prefetch", "queue_type", "max_priority", "retry_for", "connect_timeout",
        "confirm_timeout", "single_active", "ledger", "heartbeat",
        "blocked_connection_timeout", "channel_max", "frame_max", "locale", "socket_timeout",
        "stack_timeout", "ssl_options", "tcp_options",
    },
    "redis_streams": {
        "prefix", "stream_prefix", "retry_for", "socket_timeout", "socket_connect_timeout",
        "read_ahead",
    },
    "ibmmq": {
        "channel", "tls", "key_repository", "cert_label", "prefix", "create",
        "backout_threshold", "password_env", "max_payload", "persistent",
    },
    "oracle_aq": {"password_env", "prefix", "max_retries", "retention"},
    "sqlite": {"synchronous", "busy_timeout"},
    "memory": {"forget"},
    "redis_store": {
        "prefix", "retries", "socket_timeout", "socket_connect_timeout", "client_name",
        "max_connections", "health_check_interval", "ssl_cert_reqs", "ssl_ca_certs",
        "ssl_certfile", "ssl_keyfile", "ssl_check_hostname",
    },
    "sql_store": {
        "prefix", "schema", "pool_size", "max_overflow", "pool_timeout", "pool_recycle",
        "pre_ping", "connect_timeout",
    },
}  # fmt: skip


@pytest.mark.parametrize("kind", sorted(OWN))
def test_every_option_is_classified(kind: str) -> None:
    """Each option an adapter or store reads is one the policy was checked for."""
    assert set(OWN[kind][1]) == CLASSIFIED[kind]


def _own_cases() -> list[tuple[str, str, bool]]:
    return [
        (kind, name, name in OWN[kind][2])
        for kind in sorted(OWN)
        for name in sorted(CLASSIFIED[kind])
    ]


@pytest.mark.parametrize(("kind", "name", "secret"), _own_cases())
def test_own_options_are_shown_or_masked(kind: str, name: str, secret: bool) -> None:
    base = OWN[kind][0]
    value = "V4lue-Of-" + name
    url = f"{base}?{name}={value}&after=1"
    assert is_secret_option(name) is secret
    if secret:
        assert redact(url) == f"{base}?{name}={MASK}&after=1"
        assert value in url_secrets(url)
    else:
        assert redact(url) == url  # readable: options that are no secret stay as written
        assert url_secrets(url) == []


# --- the drivers' secret-bearing options ----------------------------------------------

#: Options each driver reads from a URL (or is given through one) that carry a secret:
#: librdkafka's properties it flags sensitive (rdkafka_conf.c, _RK_SENSITIVE) and the
#: Java client's it rejects but a user may still write, pika's, libpq's, PyMySQL's,
#: python-oracledb's and redis-py's.
DRIVER_SECRETS: dict[str, tuple[str, list[str]]] = {
    "librdkafka": (
        "kafka://127.0.0.1:9092",
        [
            "sasl.password",
            "ssl.key.password",
            "ssl.key.pem",
            "ssl.key.location",
            "ssl.keystore.password",
            "ssl.ca.pem",
            "https.ca.pem",
            "sasl.oauthbearer.config",
            "sasl.oauthbearer.client.secret",
            "sasl.oauthbearer.client.credentials.client.secret",
            "sasl.oauthbearer.assertion.private.key.passphrase",
            "sasl.oauthbearer.assertion.private.key.pem",
            "sasl.jaas.config",
            "ssl.truststore.password",
            "ssl.keystore.key",
            "SASL.PASSWORD",
            "Ssl.Key.Password",
        ],
    ),
    "pika": ("amqps://guest@127.0.0.1:5671/%2F", ["ssl_options"]),
    "libpq": ("postgresql://iq@db:5432/shop", ["password", "sslpassword", "PASSWORD"]),
    "pymysql": ("mysql://root@db:3306/shop", ["password", "passwd"]),
    "oracledb": (
        "oracle://app@db:1521/?service_name=FREEPDB1",
        ["password", "wallet_password", "access_token", "newpassword"],
    ),
    "redis-py": ("redis://127.0.0.1:6379/0", ["password", "ssl_password"]),
    "generic": (
        "kafka://127.0.0.1:9092",
        [
            "token", "api_key", "apikey", "api-key", "client_secret", "credentials",
            "private_key", "passphrase", "pwd", "auth_token", "secret", "access_key",
        ],
    ),
}  # fmt: skip
#: Options of the same drivers that say where a secret is or who the user is, not the
#: secret: shown as written (a name, a path, a variable, an address, a mode).
DRIVER_PLAIN: dict[str, tuple[str, list[str]]] = {
    "librdkafka": (
        "kafka://127.0.0.1:9092",
        [
            "sasl.username",
            "sasl.mechanism",
            "security.protocol",
            "ssl.ca.location",
            "ssl.certificate.location",
            "ssl.keystore.location",
            "sasl.kerberos.keytab",
            "sasl.kerberos.principal",
            "sasl.oauthbearer.client.id",
            "sasl.oauthbearer.client.credentials.client.id",
            "sasl.oauthbearer.token.endpoint.url",
            "sasl.oauthbearer.assertion.private.key.file",
            "sasl.oauthbearer.assertion.file",
            "session.timeout.ms",
            "client.id",
        ],
    ),
    "libpq": (
        "postgresql://iq@db:5432/shop",
        ["sslmode", "sslkey", "sslcert", "sslrootcert", "passfile", "application_name"],
    ),
    "oracledb": ("oracle://app@db:1521/", ["service_name", "wallet_location", "config_dir"]),
    "ibmmq": ("ibmmq://app@mq:1414/QM1", ["password_env"]),
}


def _driver_cases(table: dict[str, tuple[str, list[str]]]) -> list[tuple[str, str]]:
    return [(base, name) for base, names in table.values() for name in names]


@pytest.mark.parametrize(("base", "name"), _driver_cases(DRIVER_SECRETS))
def test_driver_secret_options_are_masked(base: str, name: str) -> None:
    join = "&" if "?" in base else "?"
    url = f"{base}{join}{name}={quote(SECRET + '/+ !')}&client.id=app-1"
    shown = redact(url)
    assert f"{name}={MASK}&client.id=app-1" in shown
    assert SECRET not in shown
    assert shown.startswith(base)  # host, port and path stay readable
    found = url_secrets(url)
    assert SECRET + "/+ !" in found  # as a driver reads it
    assert quote(SECRET + "/+ !") in found  # as written
    said = f"the driver said: {SECRET}/+ ! is wrong"
    assert scrub(said, found) == "the driver said: *** is wrong"


@pytest.mark.parametrize(("base", "name"), _driver_cases(DRIVER_PLAIN))
def test_driver_plain_options_stay_readable(base: str, name: str) -> None:
    join = "&" if "?" in base else "?"
    url = f"{base}{join}{name}=/etc/iq/{name}.value"
    assert redact(url) == url
    assert url_secrets(url) == []


def test_secrets_written_inside_an_option_are_found() -> None:
    jaas = 'org.apache.kafka.PlainLoginModule required username="u" password="J4asPw";'
    pika = "{'certfile': '/c.pem', 'keyfile': '/k.pem', 'password': 'K3yPw-1'}"
    url = (
        f"kafka://h:9092?sasl.jaas.config={quote(jaas)}"
        f"&client.id={quote('x password=Emb3dded')}"
        f"&ssl_options={quote(pika)}"
    )
    found = url_secrets(url)
    assert {"J4asPw", "K3yPw-1", "Emb3dded", jaas, pika} <= set(found)
    shown = redact(url)
    assert "sasl.jaas.config=***" in shown and "ssl_options=***" in shown
    assert "Emb3dded" not in shown and "client.id=x password=***" in shown


def test_userinfo_and_plus_encoded_values() -> None:
    url = "amqp://bridge:p%40ss+word@mq:5672/%2F?heartbeat=30"
    assert redact(url) == "amqp://bridge:***@mq:5672/%2F?heartbeat=30"
    assert {"p%40ss+word", "p@ss+word", "p@ss word"} <= set(url_secrets(url))
    assert url_secrets("sqlite:///q.db") == [] and url_secrets(None) == []


def test_scrub_redacts_every_url_it_quotes() -> None:
    text = "cannot reach kafka://h:1?sasl.password=Abcd1234&x=1 (nor amqp://g:Pw0rd5@mq/%2F)"
    assert scrub(text) == "cannot reach kafka://h:1?sasl.password=***&x=1 (nor amqp://g:***@mq/%2F)"


def test_short_secrets_are_masked_in_urls_but_not_hunted_in_text() -> None:
    url = "redis://:pw@h:6379/0"
    assert redact(url) == "redis://:***@h:6379/0"
    assert scrub(f"a pwd at {url}", url_secrets(url)) == "a pwd at redis://:***@h:6379/0"


# --- no URL error of an adapter or a store quotes a secret ----------------------------


def _open(kind: str, url: str) -> None:
    from iqbridge.adapters.ibmmq import IbmMqAdapter
    from iqbridge.adapters.kafka import KafkaAdapter
    from iqbridge.adapters.memory import MemoryAdapter
    from iqbridge.adapters.oracle_aq import OracleAQAdapter
    from iqbridge.adapters.rabbitmq import RabbitMQAdapter
    from iqbridge.adapters.redis_streams import RedisStreamsAdapter
    from iqbridge.adapters.sqlite import SqliteAdapter
    from iqbridge.outbox import Outbox
    from iqbridge.registry import open_adapter
    from iqbridge.stores.redis import RedisStore
    from iqbridge.stores.sql import SqlStore

    opener = {
        "kafka": KafkaAdapter.from_url,
        "rabbitmq": RabbitMQAdapter.from_url,
        "redis_streams": RedisStreamsAdapter.from_url,
        "ibmmq": IbmMqAdapter.from_url,
        "oracle_aq": OracleAQAdapter.from_url,
        "sqlite": SqliteAdapter.from_url,
        "memory": MemoryAdapter.from_url,
        "redis_store": RedisStore.from_url,
        "sql_store": SqlStore.from_url,
        "outbox": Outbox,
        "registry": open_adapter,
    }[kind]
    opener(url)


@pytest.mark.parametrize(
    ("kind", "url"),
    [
        ("kafka", f"kafka://127.0.0.1:1?sasl.password={SECRET}&token={SECRET}"),
        ("kafka", f"kafka://127.0.0.1:1?sasl.password={SECRET}&partitions=none"),
        ("rabbitmq", f"amqp://guest@127.0.0.1:1/%2F?password={SECRET}"),
        ("rabbitmq", f"amqp://guest:{SECRET}@127.0.0.1:1/%2F?prefetch=none"),
        ("rabbitmq", f"amqps://guest@127.0.0.1:1/%2F?ssl_options=%7B'password':'{SECRET}'"),
        ("redis_streams", f"redis://127.0.0.1:1/0?password={SECRET}"),
        ("redis_streams", f"redis://:{SECRET}@127.0.0.1:1/0?read_ahead=none"),
        ("ibmmq", f"ibmmq://app@mq:1/QM1?password={SECRET}"),
        ("ibmmq", f"ibmmq://app:{SECRET}@mq:1/QM1?persistent=maybe"),
        ("oracle_aq", f"oracle+aq://app@db:1/FREEPDB1?password={SECRET}"),
        ("oracle_aq", f"oracle+aq://app:{SECRET}@db:1/FREEPDB1?prefix=1bad"),
        ("sqlite", f"sqlite:///q.db?password={SECRET}"),
        ("sqlite", f"sqlite://app:{SECRET}@host/q.db"),
        ("memory", f"memory://m?token={SECRET}"),
        ("redis_store", f"redis://127.0.0.1:1/0?password={SECRET}"),
        ("redis_store", f"redis://:{SECRET}@127.0.0.1:1/0?retries=none"),
        ("sql_store", f"postgresql://iq@127.0.0.1:1/db?password={SECRET}&prefix=Bad!"),
        ("sql_store", f"postgresql://iq@127.0.0.1:1/db?sslpassword={SECRET}&pool_size=x"),
        ("outbox", f"nosuchdb://iq@127.0.0.1:1/db?password={SECRET}"),
        ("registry", f"127.0.0.1:1/db?password={SECRET}"),
    ],
)
def test_url_errors_never_quote_a_secret(kind: str, url: str) -> None:
    with pytest.raises(IQError) as err:
        _open(kind, url)
    assert isinstance(err.value, ConfigurationError), err.value
    text = str(err.value)
    assert SECRET not in text, text
    assert MASK in text, text  # the URL is named, redacted


# --- log lines --------------------------------------------------------------------------


def test_every_package_logger_scrubs_its_records(caplog: pytest.LogCaptureFixture) -> None:
    remember(f"kafka://h:1?sasl.password={SECRET}")
    log = get_logger("iqbridge.test.redaction")
    caplog.set_level(logging.DEBUG, logger="iqbridge.test.redaction")
    try:
        raise ValueError(f"driver echoed {SECRET}")
    except ValueError:
        log.exception("opening %s failed: %s", f"kafka://h:1?ssl.key.password={SECRET}x", SECRET)
    [record] = caplog.records
    assert record.getMessage() == "opening kafka://h:1?ssl.key.password=*** failed: ***"
    assert SECRET not in caplog.text
    assert "driver echoed ***" in caplog.text  # the traceback too


def test_every_package_module_takes_its_logger_from_get_logger() -> None:
    """A logger made with logging.getLogger would have no SecretFilter."""
    plain = re.compile(r"logging\.getLogger\((__name__|[\"']iqbridge)")
    offenders = [
        str(path.relative_to(ROOT))
        for base in ("iqbridge", "adapters", "recovery")
        for path in (ROOT / base).rglob("*.py")
        if plain.search(path.read_text())
    ]
    assert offenders == []
    named = [
        name
        for name, logger in logging.Logger.manager.loggerDict.items()
        if name.startswith("iqbridge.adapters.") and isinstance(logger, logging.Logger)
    ]
    assert named  # the adapters imported above made theirs
    for name in named:
        assert any(isinstance(f, SecretFilter) for f in logging.getLogger(name).filters), name
