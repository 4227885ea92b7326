"""The MQI definitions of the fake IBM MQ client (:mod:`iqbridge.testing.fakes.ibmmq`):
constants with the values of ``ibmmq/CMQC.py``, ``CMQXC.py`` and ``CMQCFC.py``, the
structures (MD, GMO, PMO, OD, CD, SCO, CSP) with the MQI's defaults, and the exceptions
(MQMIError with ``comp`` and ``reason``, PYIFError)."""

from __future__ import annotations

from typing import Any, ClassVar


class CMQC:
    """The MQI constants the fake knows (values from ``ibmmq/CMQC.py``)."""

    MQCC_OK = 0
    MQCC_WARNING = 1
    MQCC_FAILED = 2
    MQRC_NONE = 0
    MQRC_BACKED_OUT = 2003
    MQRC_CONNECTION_BROKEN = 2009
    MQRC_GET_INHIBITED = 2016
    MQRC_HCONN_ERROR = 2018
    MQRC_HOBJ_ERROR = 2019
    MQRC_MSG_TOO_BIG_FOR_Q = 2030
    MQRC_NO_MSG_AVAILABLE = 2033
    MQRC_NO_MSG_UNDER_CURSOR = 2034
    MQRC_NOT_AUTHORIZED = 2035
    MQRC_NOT_OPEN_FOR_BROWSE = 2036
    MQRC_NOT_OPEN_FOR_INPUT = 2037
    MQRC_NOT_OPEN_FOR_OUTPUT = 2039
    MQRC_OPTIONS_ERROR = 2046
    MQRC_PUT_INHIBITED = 2051
    MQRC_Q_FULL = 2053
    MQRC_Q_MGR_NAME_ERROR = 2058
    MQRC_Q_MGR_NOT_AVAILABLE = 2059
    MQRC_SECURITY_ERROR = 2063
    MQRC_TRUNCATED_MSG_FAILED = 2080
    MQRC_UNKNOWN_OBJECT_NAME = 2085
    MQRC_OBJECT_NAME_ERROR = 2152
    MQRC_Q_MGR_QUIESCING = 2161
    MQRC_Q_MGR_STOPPING = 2162
    MQRC_CONNECTION_QUIESCING = 2202
    MQRC_CONNECTION_STOPPING = 2203
    MQRC_NO_MSG_LOCKED = 2209
    MQRC_SSL_INITIALIZATION_ERROR = 2393
    MQRC_HMSG_ERROR = 2460
    MQRC_PROPERTY_VALUE_TOO_BIG = 2469
    MQRC_PROPERTY_NOT_AVAILABLE = 2471
    MQRC_HOST_NOT_AVAILABLE = 2538
    MQRC_CHANNEL_CONFIG_ERROR = 2539
    MQRC_UNKNOWN_CHANNEL_NAME = 2540

    MQGMO_NO_WAIT = 0x00000000
    MQGMO_WAIT = 0x00000001
    MQGMO_SYNCPOINT = 0x00000002
    MQGMO_NO_SYNCPOINT = 0x00000004
    MQGMO_BROWSE_FIRST = 0x00000010
    MQGMO_BROWSE_NEXT = 0x00000020
    MQGMO_ACCEPT_TRUNCATED_MSG = 0x00000040
    MQGMO_MSG_UNDER_CURSOR = 0x00000100
    MQGMO_LOCK = 0x00000200
    MQGMO_UNLOCK = 0x00000400
    MQGMO_FAIL_IF_QUIESCING = 0x00002000
    MQGMO_PROPERTIES_IN_HANDLE = 0x08000000
    MQGMO_VERSION_4 = 4
    MQWI_UNLIMITED = -1

    MQPMO_SYNCPOINT = 0x00000002
    MQPMO_NO_SYNCPOINT = 0x00000004
    MQPMO_NEW_MSG_ID = 0x00000040
    MQPMO_FAIL_IF_QUIESCING = 0x00002000
    MQPMO_VERSION_3 = 3

    MQOO_INPUT_AS_Q_DEF = 0x00000001
    MQOO_INPUT_SHARED = 0x00000002
    MQOO_BROWSE = 0x00000008
    MQOO_OUTPUT = 0x00000010
    MQOO_INQUIRE = 0x00000020
    MQOO_FAIL_IF_QUIESCING = 0x00002000
    MQCO_NONE = 0x00000000

    MQMO_NONE = 0x00000000
    MQMO_MATCH_MSG_ID = 0x00000001
    MQMO_MATCH_CORREL_ID = 0x00000002

    MQMI_NONE = b"\0" * 24
    MQCI_NONE = b"\0" * 24
    MQEI_UNLIMITED = -1
    MQPER_NOT_PERSISTENT = 0
    MQPER_PERSISTENT = 1
    MQPRI_PRIORITY_AS_Q_DEF = -1
    MQFMT_NONE = b"        "
    MQFMT_STRING = b"MQSTR   "
    MQTYPE_AS_SET = 0x00000000
    MQTYPE_STRING = 0x00000400
    MQCNO_CLIENT_BINDING = 0x00000800

    MQQT_LOCAL = 1
    MQMDS_PRIORITY = 0
    MQMDS_FIFO = 1
    MQIA_CURRENT_Q_DEPTH = 3
    MQIA_DEF_PERSISTENCE = 5
    MQIA_MAX_MSG_LENGTH = 13
    MQIA_MAX_Q_DEPTH = 15
    MQIA_MSG_DELIVERY_SEQUENCE = 16
    MQIA_Q_TYPE = 20
    MQIA_BACKOUT_THRESHOLD = 22
    MQCA_Q_NAME = 2016
    MQCA_BACKOUT_REQ_Q_NAME = 2019


class CMQXC:
    """Channel constants (``ibmmq/CMQXC.py``)."""

    MQCHT_CLNTCONN = 6
    MQXPT_TCP = 2


class CMQCFC:
    """PCF constants (``ibmmq/CMQCFC.py``)."""

    MQRCCF_OBJECT_ALREADY_EXISTS = 4001
    MQCMD_CREATE_Q = 11
    MQCMD_DELETE_Q = 12
    MQIACF_PURGE = 1007
    MQPO_YES = 1


class Error(Exception):
    """Base class of the client's exceptions."""


class MQMIError(Error):
    """An MQI call failed: completion code ``comp`` and reason code ``reason``."""

    def __init__(self, comp: int, reason: int, **kw: Any) -> None:
        super().__init__(comp, reason)
        self.comp, self.reason = comp, reason
        for k, v in kw.items():
            setattr(self, k, v)

    def __str__(self) -> str:
        return f"MQI Error. Comp {self.comp}, Reason {self.reason}: FAILED: {self.reason}"

    def error_as_string(self) -> str:
        """The reason as text (the real client gives its MQRC_ mnemonic)."""
        return f"FAILED: {self.reason}"


class PYIFError(Error):
    """An error of the client library itself."""

    def __init__(self, e: str) -> None:
        super().__init__(e)
        self.error = e


def _fail(reason: int) -> MQMIError:
    return MQMIError(CMQC.MQCC_FAILED, reason)


class _Struct:
    """An MQI structure: attributes with the MQI's defaults, overridable by keyword."""

    _defaults: ClassVar[dict[str, Any]] = {}

    def __init__(self, **kw: Any) -> None:
        for name, value in {**self._defaults, **kw}.items():
            setattr(self, name, value)

    def __getattr__(self, name: str) -> Any:  # unknown fields, as the real one raises
        raise AttributeError(name)

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)


class MD(_Struct):
    """MQMD, the message descriptor."""

    _defaults: ClassVar[dict[str, Any]] = {
        "MsgId": CMQC.MQMI_NONE,
        "CorrelId": CMQC.MQCI_NONE,
        "Priority": CMQC.MQPRI_PRIORITY_AS_Q_DEF,
        "Persistence": 2,  # MQPER_PERSISTENCE_AS_Q_DEF
        "Expiry": CMQC.MQEI_UNLIMITED,
        "Format": CMQC.MQFMT_NONE,
        "BackoutCount": 0,
        "PutApplName": b"",
        "PutDate": b"",
        "PutTime": b"",
        "ReplyToQ": b"",
        "UserIdentifier": b"",
    }


class GMO(_Struct):
    """MQGMO, the get-message options (version 4: with MsgHandle)."""

    _defaults: ClassVar[dict[str, Any]] = {
        "Version": CMQC.MQGMO_VERSION_4,
        "Options": CMQC.MQGMO_NO_WAIT,
        "WaitInterval": 0,
        "MatchOptions": CMQC.MQMO_MATCH_MSG_ID | CMQC.MQMO_MATCH_CORREL_ID,
        "MsgHandle": 0,
        "ReturnedLength": -1,
    }


class PMO(_Struct):
    """MQPMO, the put-message options (version 3: with OriginalMsgHandle)."""

    _defaults: ClassVar[dict[str, Any]] = {
        "Version": 1,
        "Options": 0,
        "OriginalMsgHandle": 0,
        "ResolvedQName": b"",
    }


class OD(_Struct):
    """MQOD, the object descriptor."""

    _defaults: ClassVar[dict[str, Any]] = {
        "ObjectName": b"",
        "ObjectQMgrName": b"",
        "ObjectType": 1,
    }


class CD(_Struct):
    """MQCD, the client channel definition."""

    _defaults: ClassVar[dict[str, Any]] = {
        "ChannelName": b"",
        "ConnectionName": b"",
        "ChannelType": CMQXC.MQCHT_CLNTCONN,
        "TransportType": CMQXC.MQXPT_TCP,
        "SSLCipherSpec": b"",
    }


class SCO(_Struct):
    """MQSCO, the TLS configuration options."""

    _defaults: ClassVar[dict[str, Any]] = {"KeyRepository": b"", "CertificateLabel": b""}


class CSP(_Struct):
    """MQCSP, the security parameters (user and password)."""

    _defaults: ClassVar[dict[str, Any]] = {"CSPUserId": None, "CSPPassword": None}


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.split(b"\0", 1)[0].decode().strip()
    return str(value or "").strip()
