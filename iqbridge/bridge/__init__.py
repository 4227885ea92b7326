"""Bridge daemons: move, translate and correlate messages between any two brokers,
exactly once and in order per key (seeds 000, 001 and 004). See docs/bridge.md."""

from iqbridge.bridge.config import BridgeConfig, Route, load_config, parse_config
from iqbridge.bridge.daemon import Bridge, check_health
from iqbridge.bridge.lineage import Lineage, Node
from iqbridge.bridge.route import RouteStats
from iqbridge.bridge.translate import BridgeMessage, child_id

__all__ = [
    "Bridge",
    "BridgeConfig",
    "BridgeMessage",
    "Lineage",
    "Node",
    "Route",
    "RouteStats",
    "check_health",
    "child_id",
    "load_config",
    "parse_config",
]
