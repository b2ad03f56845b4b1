"""The typed interface between the control plane and host agents, and its two transports.

``Agent`` is the protocol (:mod:`.interface`), each of its methods declaring how it crosses HTTP, read back as
:data:`OPERATIONS` (:mod:`.operations`); ``models`` are its wire values. ``InProcessAgent`` calls an agent in
this process, ``HttpAgent`` one behind :func:`create_agent_app` (see :mod:`.http_server`): both, and the app's
routes, are derived from ``OPERATIONS``.
"""

from __future__ import annotations

from . import models
from .http_client import HttpAgent
from .http_server import create_agent_app
from .inprocess import InProcessAgent
from .interface import FILE_OPS, MAX_FILE_BYTES, OPERATIONS, Agent

__all__ = [
    "FILE_OPS",
    "MAX_FILE_BYTES",
    "OPERATIONS",
    "Agent",
    "HttpAgent",
    "InProcessAgent",
    "create_agent_app",
    "models",
]
