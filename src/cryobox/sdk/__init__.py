"""Python SDK over the public HTTP API: ``Sandbox`` / ``Snapshots`` (sync) and ``AsyncSandbox`` /
``AsyncSnapshots`` (asyncio).

Both are built from one implementation: ``_async/`` is written by hand, ``_sync/`` is generated from it by
``scripts/unasync.py``, and the wire logic they share (requests, parsing, errors, retry planning) is in
``_base.py``, ``_requests.py`` and ``_snapshots.py``.
"""

from ..models import ForkTreeError, PromoteFailure, PromoteResult, Snapshot
from ._async import AsyncFilesystem, AsyncForkTree, AsyncSandbox, AsyncSnapshots
from ._base import ClientConfig, ExecResult, Lifecycle, RetryPolicy, StreamEvent
from ._sync import Filesystem, ForkTree, Sandbox, Snapshots

__all__ = [
    "AsyncFilesystem",
    "AsyncForkTree",
    "AsyncSandbox",
    "AsyncSnapshots",
    "ClientConfig",
    "ExecResult",
    "Filesystem",
    "ForkTree",
    "ForkTreeError",
    "Lifecycle",
    "PromoteFailure",
    "PromoteResult",
    "RetryPolicy",
    "Sandbox",
    "Snapshot",
    "Snapshots",
    "StreamEvent",
]
