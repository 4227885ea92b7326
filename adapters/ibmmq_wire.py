"""IBM MQ wire format, names, URL settings and error translation for
:mod:`iqbridge.adapters.ibmmq`.

Everything here is pure Python over the client module's constants (``mod.CMQC``): no
connection is made, so it is the same for IBM's ``ibmmq`` package, ``pymqi`` and the
test fake (:mod:`iqbridge.testing.fakes.ibmmq`).
"""

from __future__ import annotations

import calendar
import hashlib
import json
import math
import os
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from iqbridge.errors import (
    BrokerRefused,
    BrokerUnavailable,
    ConfigurationError,
    IQError,
    UnknownQueueError,
)
from iqbridge.ids import adopted_id
from iqbridge.model import Envelope
from iqbridge.redaction import get_logger, remember_secret

log = get_logger(__name__)

__all__ = [
    "ENV_PROPERTY",
    "INSTALL_HINT",
    "Settings",
    "correl_id",
    "decode",
    "encode_props",
    "expiry_tenths",
    "mq_name",
    "msg_id_bytes",
    "parse_url",
    "reason_name",
    "translate",
]

#: The message property that carries iqbridge's envelope (JSON): its presence marks a
#: message iqbridge put; a message without it is a plain client's and is adopted.
ENV_PROPERTY = "iqEnv"

#: IBM's page on the MQ C client the Python client needs.
CLIENT_DOCS = "https://www.ibm.com/docs/en/ibm-mq/9.4?topic=overview-redistributable-mq-clients"

INSTALL_HINT = (
    "the ibmmq:// adapter needs IBM's Python client: pip install 'iqbridge[ibmmq]' (the "
    "'ibmmq' package; 'pymqi' works too). Both call the IBM MQ C client library, which is "
    "not on PyPI: install the IBM MQ redistributable client (or an MQ client or server) "
    f"first and make its lib64 directory findable (LD_LIBRARY_PATH); see {CLIENT_DOCS}"
)

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
_OPTIONS = frozenset(
    {
        "channel",
        "tls",
        "key_repository",
        "cert_label",
        "prefix",
        "create",
        "backout_threshold",
        "password_env",
        "max_payload",
        "persistent",
    }
)
#: Where the password comes from when the URL has none.
PASSWORD_ENV = "IQBRIDGE_IBMMQ_PASSWORD"
#: MQ's default MAXMSGL (of a local queue, the queue manager and a channel): 4 MiB.
MQ_DEFAULT_MAXMSGL = 4 * 1024 * 1024
#: The largest payload by default: MQ's default MAXMSGL less 64 KiB for the envelope
#: property (properties count towards a message's length).
DEFAULT_MAX_PAYLOAD = MQ_DEFAULT_MAXMSGL - 64 * 1024


@dataclass(frozen=True, slots=True)
class Settings:
    """What an ``ibmmq://`` URL says."""

    host: str
    port: int
    qmgr: str
    channel: str
    user: str | None
    password: str | None = field(repr=False)  # never printed
    tls: str
    key_repository: str
    cert_label: str
    prefix: str
    create: bool
    backout_threshold: int
    max_payload: int
    persistent: bool

    @property
    def conn_name(self) -> str:
        """MQ's CONNAME: ``host(port)``."""
        return f"{self.host}({self.port})"


def parse_url(url: str, safe: str) -> Settings:
    """The settings of ``ibmmq://user[:password]@host[:port]/QMGR?options`` (``safe``: the
    URL without its password, for messages)."""
    try:
        parts = urlsplit(url)
        port = parts.port or 1414
    except ValueError as exc:
        raise ConfigurationError(f"IBM MQ URL {safe!r}: {exc}") from exc
    if parts.scheme != "ibmmq" or not parts.hostname:
        raise ConfigurationError(
            f"not an IBM MQ URL: {safe!r}; write ibmmq://user@host:1414/QM1?channel=DEV.APP.SVRCONN"
        )
    qmgr = unquote(parts.path.strip("/"))
    if not qmgr or "/" in qmgr or len(qmgr) > 48:
        raise ConfigurationError(
            f"IBM MQ URL {safe!r} names no queue manager: put its name in the path, "
            f"as in ibmmq://user@host:1414/QM1"
        )
    opts = dict(parse_qsl(parts.query, keep_blank_values=True))
    unknown = set(opts) - _OPTIONS
    if unknown:
        raise ConfigurationError(
            f"unknown IBM MQ option(s) {sorted(unknown)} in {safe}; known: "
            f"{', '.join(sorted(_OPTIONS))}"
        )

    def flag(name: str, default: bool) -> bool:
        value = opts.get(name, str(default)).lower()
        if value not in _TRUE | _FALSE:
            raise ConfigurationError(f"IBM MQ URL {safe}: {name} must be true or false")
        return value in _TRUE

    def number(name: str, default: int, low: int, high: int) -> int:
        try:
            value = int(opts.get(name, default))
        except ValueError:
            value = low - 1
        if not low <= value <= high:
            raise ConfigurationError(
                f"IBM MQ URL {safe}: {name} must be a whole number from {low} to {high}, "
                f"not {opts.get(name)!r}"
            )
        return value

    tls = opts.get("tls", "")
    if tls.lower() in _FALSE:
        tls = ""
    elif tls.lower() in _TRUE:
        tls = "ANY_TLS12_OR_HIGHER"
    if tls and not opts.get("key_repository"):
        raise ConfigurationError(
            f"IBM MQ URL {safe}: tls={tls} needs key_repository=<path of the key database, "
            f"without .kdb>"
        )
    user = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password is not None else None
    if password is None and user:
        password = os.environ.get(opts.get("password_env", PASSWORD_ENV))
    remember_secret(password)  # one from the environment too: kept out of every log line
    return Settings(
        host=parts.hostname,
        port=port,
        qmgr=qmgr,
        channel=opts.get("channel", "DEV.APP.SVRCONN"),
        user=user,
        password=password,
        tls=tls,
        key_repository=opts.get("key_repository", ""),
        cert_label=opts.get("cert_label", ""),
        prefix=opts.get("prefix", ""),
        create=flag("create", False),
        backout_threshold=number("backout_threshold", 5, 0, 999_999_999),
        max_payload=number("max_payload", DEFAULT_MAX_PAYLOAD, 1, 100 * 1024 * 1024),
        persistent=flag("persistent", True),
    )


# --- names ---------------------------------------------------------------------------

_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._/%")


def mq_name(text: str) -> str:
    """An MQ object name for ``text``: itself when it is a valid name (at most 48 of
    ``A-Z a-z 0-9 . _ / %``); else its valid characters (others as ``_``), cut to 39, then
    ``%`` and 8 hex digits of its SHA-1, so distinct texts keep distinct names."""
    if len(text) <= 48 and set(text) <= _NAME_CHARS:
        return text
    clean = "".join(c if c in _NAME_CHARS else "_" for c in text)
    return f"{clean[:39]}%{hashlib.sha1(text.encode()).hexdigest()[:8]}"


# --- the wire format -------------------------------------------------------------------

_MSG_ID_MARK = b"iqbridge"


def msg_id_bytes(msg_id: str) -> bytes:
    """The 24-byte MQMD MsgId of an iqbridge msg_id: its 16 UUID bytes and ``iqbridge``
    (a msg_id that is no UUID: the first 16 bytes of its SHA-256)."""
    try:
        raw = uuid.UUID(msg_id).bytes
    except ValueError:
        raw = hashlib.sha256(msg_id.encode()).digest()[:16]
    return raw + _MSG_ID_MARK


def correl_id(correlation_id: str | None) -> bytes:
    """The 24-byte MQMD CorrelId: the correlation id's UTF-8 bytes, zero-padded, when they
    fit; else the first 24 bytes of their SHA-256 (the whole id travels in the envelope)."""
    if not correlation_id:
        return b"\0" * 24
    raw = correlation_id.encode()
    return raw.ljust(24, b"\0") if len(raw) <= 24 else hashlib.sha256(raw).digest()[:24]


def expiry_tenths(env: Envelope) -> int:
    """MQMD Expiry (tenths of a second from the put, -1 for none) of the put's ttl."""
    if env.expires_at is None:
        return -1
    # Expiry is an MQLONG (32 bits: about 6.8 years in tenths); longer is as good as none.
    tenths = math.ceil((env.expires_at - env.put_at) / 100_000)
    return -1 if tenths > 2**31 - 1 else max(1, tenths)


def encode_props(env: Envelope) -> str:
    """The envelope property's value: every field the MQMD does not carry, as JSON."""
    return json.dumps(
        {
            "id": env.msg_id,
            "ct": env.content_type,
            "h": env.headers,
            "pub": env.publisher,
            "cid": env.correlation_id,
            "key": env.ordering_key,
            "par": list(env.parents),
            "at": env.put_at,
            "exp": env.expires_at,
            "to": list(env.groups),
        },
        separators=(",", ":"),
    )


def _put_time(date: Any, tod: Any) -> int:
    """Microseconds since the epoch of MQMD PutDate (YYYYMMDD) and PutTime (HHMMSSTH), UTC."""
    try:
        d = _str(date)
        t = _str(tod)
        secs = calendar.timegm(
            (int(d[:4]), int(d[4:6]), int(d[6:8]), int(t[:2]), int(t[2:4]), int(t[4:6]))
        )
        return secs * 1_000_000 + int(t[6:8] or 0) * 10_000
    except (ValueError, IndexError):
        return 0


def _str(value: Any) -> str:
    if isinstance(value, bytes):
        return value.split(b"\0", 1)[0].decode("utf-8", "replace").strip()
    return str(value or "").strip()


def decode(
    queue: str, group: str, md: Any, body: bytes, env_json: str | None, fmt_string: bytes
) -> tuple[str, Envelope, bool]:
    """The native reference, envelope and whether it was adopted, of a message got from a
    group's queue.

    iqbridge's messages carry the envelope property; their reference is their msg_id. A
    plain client's message is adopted: its reference is its MsgId in hex, its msg_id
    derives from the queue, the group and that reference, and it is addressed to the
    group whose queue it was found on. So is a message whose envelope property cannot be
    decoded (not JSON, no "id"), with a warning: refusing it would leave it at the head
    of the group's queue for ever.
    """
    priority = min(max(int(md.Priority), 0), 9)
    ref = bytes(md.MsgId).hex()
    if env_json is not None:
        try:
            f = json.loads(env_json)
            if not isinstance(f, dict) or not isinstance(f.get("id"), str) or not f["id"]:
                raise ValueError('no "id"')
            env = Envelope(
                msg_id=f["id"],
                body=body,
                content_type=f.get("ct") or "application/octet-stream",
                headers=dict(f.get("h") or {}),
                publisher=f.get("pub") or "",
                correlation_id=f.get("cid"),
                priority=priority,
                ordering_key=f.get("key") or "",
                parents=tuple(f.get("par") or ()),
                put_at=int(f.get("at") or 0),
                groups=tuple(f.get("to") or ()),
                expires_at=f.get("exp"),
            )
            return env.msg_id, env, False
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            log.warning(
                "IBM MQ queue for %r group %r: message %s has an undecodable %s property "
                "(%s); adopted as a plain client's message",
                queue,
                group,
                ref,
                ENV_PROPERTY,
                type(exc).__name__,
            )
    correl = bytes(md.CorrelId)
    text = bytes(md.Format) == fmt_string
    env = Envelope(
        msg_id=adopted_id("ibmmq", queue, f"{group}/{ref}"),
        body=body,
        content_type="text/plain; charset=utf-8" if text else "application/octet-stream",
        publisher=_str(md.PutApplName) or "(legacy)",
        correlation_id=correl.hex() if correl.strip(b"\0") else None,
        priority=priority,
        put_at=_put_time(md.PutDate, md.PutTime),
        groups=(group,),
    )
    return ref, env, True


# --- errors --------------------------------------------------------------------------

_REASONS = {
    2009: "MQRC_CONNECTION_BROKEN",
    2016: "MQRC_GET_INHIBITED",
    2030: "MQRC_MSG_TOO_BIG_FOR_Q",
    2031: "MQRC_MSG_TOO_BIG_FOR_Q_MGR",
    2033: "MQRC_NO_MSG_AVAILABLE",
    2035: "MQRC_NOT_AUTHORIZED",
    2051: "MQRC_PUT_INHIBITED",
    2053: "MQRC_Q_FULL",
    2058: "MQRC_Q_MGR_NAME_ERROR",
    2059: "MQRC_Q_MGR_NOT_AVAILABLE",
    2063: "MQRC_SECURITY_ERROR",
    2085: "MQRC_UNKNOWN_OBJECT_NAME",
    2152: "MQRC_OBJECT_NAME_ERROR",
    2161: "MQRC_Q_MGR_QUIESCING",
    2162: "MQRC_Q_MGR_STOPPING",
    2202: "MQRC_CONNECTION_QUIESCING",
    2203: "MQRC_CONNECTION_STOPPING",
    2223: "MQRC_Q_MGR_NOT_ACTIVE",
    2273: "MQRC_CONNECTION_ERROR",
    2393: "MQRC_SSL_INITIALIZATION_ERROR",
    2397: "MQRC_JSSE_ERROR",
    2538: "MQRC_HOST_NOT_AVAILABLE",
    2539: "MQRC_CHANNEL_CONFIG_ERROR",
    2540: "MQRC_UNKNOWN_CHANNEL_NAME",
    4001: "MQRCCF_OBJECT_ALREADY_EXISTS",
}
#: The connection is gone or cannot be made: worth retrying later.
UNAVAILABLE = frozenset({2009, 2059, 2161, 2162, 2202, 2203, 2223, 2273, 2538, 2539})


def reason_name(reason: int) -> str:
    """``2035 MQRC_NOT_AUTHORIZED`` and the like."""
    return f"{reason} {_REASONS.get(reason, 'MQRC')}"


def translate(
    exc: Any, settings: Settings, url: str, doing: str, mq_queue: str | None = None
) -> IQError:
    """The iqbridge error for an MQMIError raised while ``doing`` something (no password
    and no connection string from the driver in the text)."""
    reason = int(getattr(exc, "reason", 0))
    what = f"IBM MQ queue manager {settings.qmgr} at {settings.conn_name} ({url})"
    if not reason:  # the client library's own error (PYIFError), no MQI reason code
        return BrokerUnavailable(
            f"IBM's MQ client failed while {doing} with {what}: {type(exc).__name__}"
        )
    rc = reason_name(reason)
    if reason in UNAVAILABLE:
        return BrokerUnavailable(
            f"cannot reach {what} while {doing} ({rc}); check that the queue manager runs "
            f"(dspmq), that its listener serves port {settings.port} and that channel "
            f"{settings.channel} is defined and running"
        )
    if reason in (2035, 2063):
        target = f" on queue {mq_queue!r}" if mq_queue else ""
        return ConfigurationError(
            f"{what} refused user {settings.user or '(none)'}{target} while {doing} ({rc}): "
            f"check the password (in the URL or ${PASSWORD_ENV}), the channel's CHLAUTH "
            f"rules and the user's authority: SET AUTHREC PROFILE('{mq_queue or '**'}') "
            f"OBJTYPE(QUEUE) PRINCIPAL('{settings.user or 'app'}') AUTHADD(PUT,GET,BROWSE,INQ); "
            f"the queue manager's error log (AMQERR01.LOG) says which check failed"
        )
    if reason == 2085:
        return UnknownQueueError(
            f"queue {mq_queue!r} does not exist on {what} while {doing} ({rc}): define it "
            f"(see docs/adapters/ibmmq.md: DEFINE QLOCAL('{mq_queue}') ...) or connect with "
            f"?create=true to let the adapter create it (its user needs +crt authority)"
        )
    if reason == 2058:
        return ConfigurationError(
            f"the queue manager at {settings.conn_name} is not {settings.qmgr} ({rc}): put "
            f"the right queue manager name in the URL's path"
        )
    if reason == 2540:
        return ConfigurationError(
            f"{what} has no server-connection channel {settings.channel} ({rc}): pass "
            f"?channel=<name of a SVRCONN channel>"
        )
    if reason in (2393, 2397):
        return ConfigurationError(
            f"TLS to {what} failed ({rc}): check tls=<CipherSpec> (it must match the "
            f"channel's SSLCIPH) and key_repository"
        )
    if reason == 2152:
        return ConfigurationError(f"{what}: bad object name {mq_queue!r} while {doing} ({rc})")
    if reason in (2030, 2031):
        return BrokerRefused(
            f"{what} refused a message for {mq_queue!r} as too large ({rc}): raise the "
            f"queue's MAXMSGL (and the queue manager's and channel's) or put less; "
            f"nothing of it is stored"
        )
    if reason in (2051, 2053, 2016):
        return BrokerRefused(
            f"{what} refused {doing} on {mq_queue!r} ({rc}); nothing of it is stored"
        )
    return BrokerUnavailable(f"{what} failed while {doing} ({rc})")
