"""iqbridge: one Python facade and one message-state model over many brokers.

Quick start (embedded SQLite, no server)::

    import iqbridge

    with iqbridge.connect("sqlite:///demo.db") as hub:
        orders = hub.queue("orders")
        msg_id = orders.put({"order": 1}, to=["billing", "audit"])
        with orders.get("billing") as delivery:   # IN_PROCESS ... DONE
            print(delivery.payload)
        print(orders.state(msg_id).subscribers["billing"].state)   # JOURNALLED
"""

from iqbridge.batch import Batch, Settled
from iqbridge.delivery import Delivery
from iqbridge.errors import (
    AudienceError,
    BatchLeaseLost,
    BrokerRefused,
    BrokerUnavailable,
    ConcurrentUpdate,
    ConfigurationError,
    ConnectionError,
    IllegalTransition,
    IndexUnavailable,
    InvalidArgument,
    IQError,
    LeaseLost,
    LockedError,
    MessageError,
    MessageNotFound,
    MessageTooLarge,
    PayloadError,
    PayloadNotRetained,
    QueueError,
    UnknownQueueError,
    UnknownSchemeError,
)
from iqbridge.hub import DEFAULT_URL, Hub, connect
from iqbridge.model import (
    Filter,
    JournalEntry,
    MessageState,
    MessageSummary,
    Pool,
    SubscriberView,
    Subscriptions,
)
from iqbridge.putting import Outgoing
from iqbridge.queue import Browse, Queue
from iqbridge.retry import RetryPolicy
from iqbridge.states import Mode, PublisherState, SubscriberState

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_URL",
    "AudienceError",
    "Batch",
    "BatchLeaseLost",
    "Browse",
    "BrokerRefused",
    "BrokerUnavailable",
    "ConcurrentUpdate",
    "ConfigurationError",
    "ConnectionError",
    "Delivery",
    "Filter",
    "Hub",
    "IQError",
    "IllegalTransition",
    "IndexUnavailable",
    "InvalidArgument",
    "JournalEntry",
    "LeaseLost",
    "LockedError",
    "MessageError",
    "MessageNotFound",
    "MessageState",
    "MessageSummary",
    "MessageTooLarge",
    "Mode",
    "Outgoing",
    "PayloadError",
    "PayloadNotRetained",
    "Pool",
    "PublisherState",
    "Queue",
    "QueueError",
    "RetryPolicy",
    "Settled",
    "SubscriberState",
    "SubscriberView",
    "Subscriptions",
    "UnknownQueueError",
    "UnknownSchemeError",
    "__version__",
    "connect",
]
