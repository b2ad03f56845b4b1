"""Python SDK over the public HTTP API: ``Sandbox`` / ``Snapshots`` (sync) and ``AsyncSandbox`` /
``AsyncSnapshots`` (asyncio); a sandbox's background processes are ``Process`` / ``AsyncProcess``
(``sbx.processes``).

Both are built from one implementation: ``_async/`` is written by hand, ``_sync/`` is generated from it by
``scripts/unasync.py``, and the wire logic they share (requests, parsing, errors, retry planning) is in
``_base.py``, ``_requests.py``, ``_snapshots.py`` and ``_procs.py``.
"""

from ..models import ForkTreeError, ProcessResult, PromoteFailure, PromoteResult, Snapshot
from ._async import AsyncFilesystem, AsyncForkTree, AsyncProcess, AsyncProcesses, AsyncSandbox, AsyncSnapshots
from ._base import ClientConfig, ExecResult, Lifecycle, RetryPolicy, StreamEvent
from ._procs import FsWatchEvent
from ._sync import Filesystem, ForkTree, Process, Processes, Sandbox, Snapshots

__all__ = [
    "AsyncFilesystem",
    "AsyncForkTree",
    "AsyncProcess",
    "AsyncProcesses",
    "AsyncSandbox",
    "AsyncSnapshots",
    "ClientConfig",
    "ExecResult",
    "Filesystem",
    "ForkTree",
    "ForkTreeError",
    "FsWatchEvent",
    "Lifecycle",
    "Process",
    "ProcessResult",
    "Processes",
    "PromoteFailure",
    "PromoteResult",
    "RetryPolicy",
    "Sandbox",
    "Snapshot",
    "Snapshots",
    "StreamEvent",
]
