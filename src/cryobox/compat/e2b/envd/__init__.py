"""E2B's in-sandbox daemon (envd) served by the control plane: the unchanged ``e2b`` SDK's commands, PTYs and file
calls arrive at ``/e2b/sandbox`` and are translated onto the typed agent interface.

``app`` (the ASGI app and its port dispatch) → ``process`` / ``filesystem`` (the Connect services, message mapping
in ``procmap`` / ``entries``) and ``files`` (the REST routes, ``multipart``); ``session`` (token, user, paths),
``errors`` (the one error boundary), ``streams`` (keepalives and closing). ``proto/`` is E2B's contract
(Apache-2.0, see ``proto/NOTICE``); ``gen/`` is generated from it by ``make proto``.
"""

from __future__ import annotations

from .app import ENVD_PORT, EnvdApp, Forward, create_envd_app

__all__ = ["ENVD_PORT", "EnvdApp", "Forward", "create_envd_app"]
