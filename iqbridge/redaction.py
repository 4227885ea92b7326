"""What is secret in a URL, and how it is hidden: one policy for every place iqbridge
shows a URL or writes a line (errors, logs, health records, the admin API and
dashboard, metrics and traces).

A URL's secrets are the password of its user part and the value of every query option
:func:`is_secret_option` names secret (``sasl.password``, ``ssl.key.password``,
``password``, ``wallet_password``, ``sasl.oauthbearer.client.secret``, ``access_token``,
``sasl.jaas.config``, inline private keys, ...). :func:`redact` shows the URL with each
replaced by ``***`` and everything else as written (scheme, user name, hosts, ports,
path, option names, other options' values); :func:`url_secrets` lists the secret values
themselves, as written and decoded, to scrub from text that may quote them (a driver's
error message). Redaction is for display only: a driver always gets the URL as given.

Log records: every logger of the package comes from :func:`get_logger`, which adds a
:class:`SecretFilter`: it scrubs the secrets of every URL the process opened
(:func:`remember`, called when an adapter, an index store or an outbox is opened) and
redacts any URL quoted in the line, so no iqbridge log line carries a secret, whatever
wrote it.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable
from urllib.parse import quote, quote_plus, unquote, unquote_plus, urlsplit

__all__ = [
    "MASK",
    "MIN_SCRUBBED",
    "SecretFilter",
    "get_logger",
    "is_secret_option",
    "known_secrets",
    "redact",
    "remember",
    "remember_secret",
    "scrub",
    "url_secrets",
]

#: What a secret is replaced by.
MASK = "***"
#: Secrets shorter than this are masked where a URL shows them but not looked for in
#: free text: replacing every "pw" or "iq" in a line would garble it.
MIN_SCRUBBED = 4

#: Words that make an option secret wherever they appear in its name (compared in lower
#: case, with ``.``, ``-`` and spaces read as ``_``).
_SECRET_WORDS = (
    "password",  # sasl.password, ssl.key.password, ssl.keystore.password, sslpassword...
    "passwd",
    "pwd",
    "passphrase",  # sasl.oauthbearer.assertion.private.key.passphrase
    "secret",  # sasl.oauthbearer.client.secret, client_secret
    "token",  # access_token, token, auth_token
    "credential",
    "apikey",
    "api_key",
    "accesskey",
    "access_key",
    "privatekey",
    "private_key",  # sasl.oauthbearer.assertion.private.key.pem
    "jaas",  # sasl.jaas.config: a login module line holding passwords
    "authorization",
)
#: Options secret by name though no word above says so (librdkafka flags them
#: sensitive; pika's ssl_options is a dict that may hold the key's password).
_SECRET_NAMES = frozenset(
    {"ssl_key_location", "sasl_oauthbearer_config", "ssl_options", "key", "sig"}
)
#: Endings of names that say where a secret is kept or which one it is, not the secret:
#: shown as written (password_env=IQBRIDGE_ORACLE_PASSWORD names a variable, ..._file a
#: path, sasl.oauthbearer.client.credentials.client.id an identity).
_WHERE = ("_env", "_file", "_location", "_path", "_url", "_endpoint", "_id")
_SEPARATORS = re.compile(r"[.\-\s]+")
#: name=value, name: value, 'name': 'value', name="value" inside an option's value.
_EMBEDDED = re.compile(
    r"""(?P<name>[A-Za-z_][\w.\-]*)(?P<q1>['"]?)(?P<sep>\s*[=:]\s*)(?P<q2>['"]?)"""
    r"""(?P<value>[^'"\s,;&}]*)"""
)
#: What may follow a URL quoted in a line of text.
_CLOSERS = ").,;:]}>"
#: A URL quoted in a line of text (up to the next blank or quote).
_URL_IN_TEXT = re.compile(r"""[A-Za-z][A-Za-z0-9+.\-]*://[^\s'"<>`]+""")


def is_secret_option(name: str) -> bool:
    """Whether a URL option (a query parameter) carries a secret, by its name (any case;
    ``.``, ``-`` and ``_`` alike)."""
    norm = _SEPARATORS.sub("_", name.strip().lower())
    if norm in _SECRET_NAMES or norm.endswith(("_pem", "_key")) or norm == "pem":
        return True  # inline key material (ssl.key.pem, ssl.keystore.key) is never shown
    if norm.endswith(_WHERE):
        return False
    return any(word in norm for word in _SECRET_WORDS)


def _split(url: str) -> tuple[str, str | None, str] | None:
    """``url`` as written, in three: everything before the user part's password
    (scheme, ``://``, user name and ``:``), the password (None when there is no ``:``
    in a user part), and the rest (the ``@``, hosts, path, and the query from its ``?``
    on); None when urllib cannot read it (a broken IPv6 host)."""
    try:
        urlsplit(url)
    except ValueError:
        return None
    head, sep, rest = url.partition("://")
    if not sep:
        return "", None, url
    head += sep
    before_query = rest.partition("?")[0]
    authority = re.split(r"[/#]", before_query, maxsplit=1)[0]
    # A password holding an unescaped / or # ends the authority early for urllib (and
    # the driver), but it is still the user's secret: mask up to the last @ then.
    at = before_query.rfind("@") if authority else -1
    user, colon, password = before_query[: max(at, 0)].partition(":")
    if not colon:
        return head, None, rest
    return head + user + colon, password, rest[at:]


def _mask_embedded(text: str) -> str:
    def sub(m: re.Match[str]) -> str:
        if not m.group("value") or not is_secret_option(m.group("name")):
            return m.group(0)
        return m.group(0)[: m.start("value") - m.start(0)] + MASK

    return _EMBEDDED.sub(sub, text)


def _mask_query(query: str) -> str:
    """A query string with each secret option's value as ``***`` (to its end: a ``#``
    in a password does not leave the rest of it shown)."""
    pieces = []
    for piece in query.split("&"):
        name, eq, value = piece.partition("=")
        shown = value
        if eq and value:
            if is_secret_option(unquote_plus(name)):
                # Masked already (a redacted URL quoted in a line, then a bracket or a
                # stop): kept as it is, so redacting twice changes nothing.
                done = value.startswith(MASK) and not value[len(MASK) :].strip(_CLOSERS)
                shown = value if done else MASK
            elif _mask_embedded(unquote_plus(value)) != unquote_plus(value):
                shown = _mask_embedded(unquote_plus(value))
        pieces.append(f"{name}{eq}{shown}")
    return "&".join(pieces)


def redact(url: str) -> str:
    """The URL with every secret replaced by ``***`` (the user part's password and each
    secret option's value), the rest as written: safe for errors, logs and displays.
    ``<unparseable URL>`` when urllib cannot read it."""
    parts = _split(url)
    if parts is None:
        return "<unparseable URL>"
    head, password, rest = parts
    if password is not None:
        head += MASK
    before, q, query = rest.partition("?")
    return head + before + q + _mask_query(query) if q else head + rest


def _forms(raw: str) -> set[str]:
    """A secret as written in a URL and as a driver or a re-encoding may show it."""
    plain = unquote_plus(raw)
    return {raw, unquote(raw), plain, quote_plus(plain), quote(plain, safe="")}


def _embedded_secrets(text: str) -> set[str]:
    found: set[str] = set()
    for m in _EMBEDDED.finditer(text):
        if m.group("value") and is_secret_option(m.group("name")):
            found |= _forms(m.group("value"))
    return found


def url_secrets(url: str | None) -> list[str]:
    """Every secret value in a URL (the password, each secret option's value, secrets
    written inside other options' values), raw and decoded, longest first: the strings
    to scrub from text."""
    if not isinstance(url, str) or not url:
        return []
    parts = _split(url)
    if parts is None:
        return []
    _, password, rest = parts
    found: set[str] = set()
    if password:
        found |= _forms(password)
    for piece in rest.partition("?")[2].split("&"):
        name, eq, value = piece.partition("=")
        if not (eq and value):
            continue
        if is_secret_option(unquote_plus(name)):
            # What a driver reads stops at a #; what was written goes on.
            found |= _forms(value) | _forms(value.partition("#")[0])
        found |= _embedded_secrets(unquote_plus(value))
    found -= {"", MASK}
    return sorted(found, key=lambda s: (-len(s), s))


def scrub(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with each of ``secrets`` (of at least :data:`MIN_SCRUBBED` characters),
    and the secrets of every URL it quotes, replaced by ``***``."""
    for secret in sorted({s for s in secrets if len(s) >= MIN_SCRUBBED}, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return _URL_IN_TEXT.sub(lambda m: redact(m.group(0)), text)


class _Known:
    """The remembered secrets, longest first (replaced whole, so readers need no lock)."""

    secrets: tuple[str, ...] = ()
    lock = threading.Lock()


def remember(*urls: str | None) -> None:
    """Add the secrets of ``urls`` to those every iqbridge log line is scrubbed of."""
    found: set[str] = set()
    for url in urls:
        found.update(url_secrets(url))
    _add(found)


def remember_secret(value: str | None) -> None:
    """Add one secret (a password read from the environment, say) to those every
    iqbridge log line is scrubbed of."""
    if value:
        _add({value})


def _add(found: set[str]) -> None:
    found = {s for s in found if len(s) >= MIN_SCRUBBED}
    with _Known.lock:
        if found.issubset(_Known.secrets):
            return
        _Known.secrets = tuple(sorted(found.union(_Known.secrets), key=len, reverse=True))


def known_secrets() -> tuple[str, ...]:
    """The secrets :func:`remember` was told of, longest first."""
    return _Known.secrets


class SecretFilter(logging.Filter):
    """Scrubs a log record of every remembered secret and of any URL's secrets: its
    message, its arguments (merged into the message), its traceback and stack."""

    def filter(self, record: logging.LogRecord) -> bool:
        secrets = known_secrets()
        try:
            message = record.getMessage()
        except Exception:  # a bad format: the handler reports it, with the record as is
            return True
        clean = scrub(message, secrets)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = scrub(record.exc_text, secrets)
        if record.stack_info:
            record.stack_info = scrub(record.stack_info, secrets)
        return True


_FILTER = SecretFilter()


def get_logger(name: str) -> logging.Logger:
    """The logger ``name`` with a :class:`SecretFilter` (every iqbridge module takes its
    logger from here)."""
    logger = logging.getLogger(name)
    if not any(isinstance(f, SecretFilter) for f in logger.filters):
        logger.addFilter(_FILTER)
    return logger
