"""Backward-compatible import path for the synchronous SDK (``cryobox.sdk.sandbox.Sandbox``).

The classes live in ``cryobox.sdk._sync`` (generated from ``cryobox.sdk._async``) and ``cryobox.sdk._base``.
"""

from ._base import ExecResult, Lifecycle, RetryPolicy, StreamEvent
from ._sync.sandbox import Filesystem, Sandbox

__all__ = ["ExecResult", "Filesystem", "Lifecycle", "RetryPolicy", "Sandbox", "StreamEvent"]
