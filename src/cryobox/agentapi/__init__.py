"""The typed interface between the control plane and host agents, and its two transports.

``Agent`` is the protocol (:mod:`.interface`), ``models`` its wire values; ``InProcessAgent`` calls an agent in
this process, ``HttpAgent`` one behind :func:`create_agent_app` (see :mod:`.http_server`).
"""

from __future__ import annotations

from . import models
from .http_client import HttpAgent
from .http_server import create_agent_app
from .inprocess import InProcessAgent
from .interface import FILE_OPS, MAX_FILE_BYTES, Agent

__all__ = ["FILE_OPS", "MAX_FILE_BYTES", "Agent", "HttpAgent", "InProcessAgent", "create_agent_app", "models"]
