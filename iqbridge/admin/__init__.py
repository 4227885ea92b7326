"""The admin API and dashboard over every configured hub (``iq admin serve``).

Needs the ``admin`` extra (``pip install 'iqbridge[admin]'``): FastAPI, uvicorn, Jinja2
and python-multipart. See docs/admin.md.
"""

from iqbridge.admin.app import create_app
from iqbridge.admin.auth import Principal, TokenRing
from iqbridge.admin.config import AdminConfig, AdminConfigError, load_config, parse_config

__all__ = [
    "AdminConfig",
    "AdminConfigError",
    "Principal",
    "TokenRing",
    "create_app",
    "load_config",
    "parse_config",
]
