"""Python SDK over the public HTTP API: ``Sandbox`` (sync) and ``AsyncSandbox`` (asyncio).

Both are built from one implementation: ``_async/`` is written by hand, ``_sync/`` is generated from it by
``scripts/unasync.py``, and the wire logic they share (requests, parsing, errors, retry planning) is in
``_base.py``.
"""

from ._async import AsyncFilesystem, AsyncSandbox
from ._base import ClientConfig, ExecResult, Lifecycle, RetryPolicy, StreamEvent
from ._sync import Filesystem, Sandbox

__all__ = [
    "AsyncFilesystem",
    "AsyncSandbox",
    "ClientConfig",
    "ExecResult",
    "Filesystem",
    "Lifecycle",
    "RetryPolicy",
    "Sandbox",
    "StreamEvent",
]
