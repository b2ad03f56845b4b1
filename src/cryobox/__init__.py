"""cryobox: self-hosted microVM sandboxes where every create is a snapshot restore.

from cryobox import Sandbox

with Sandbox.create(template="code-interpreter") as sbx:
    print(sbx.exec("python3 -c 'print(6 * 7)'").stdout)

``AsyncSandbox`` has the same methods for asyncio (``async with await AsyncSandbox.create() as sbx``).
Snapshots and forks: ``sbx.snapshot()``, ``Sandbox.create(from_snapshot=...)``, ``sbx.fork()``,
``sbx.fork_tree(n)`` and ``Snapshots`` (``AsyncSnapshots``) for the workspace's snapshots. Background
processes: ``sbx.processes.start(cmd)`` or ``sbx.exec(cmd, background=True)`` → ``Process`` (``stream``,
``wait``, ``send_stdin``, ``signal``, ``kill``); directory watches: ``sbx.filesystem.watch(path)``.
"""

from .errors import (
    CommandFailed,
    CryoboxError,
    GuestError,
    HostUnavailable,
    InvalidArgument,
    NotFound,
    PayloadTooLarge,
    QuotaExceeded,
    SandboxTimeout,
    StateError,
    Unauthorized,
    VmmError,
    WorkspaceQuotaExceeded,
)
from .models import ForkTreeError, ProcessResult, PromoteFailure, PromoteResult, Snapshot
from .sdk import (
    AsyncFilesystem,
    AsyncForkTree,
    AsyncProcess,
    AsyncProcesses,
    AsyncSandbox,
    AsyncSnapshots,
    ExecResult,
    Filesystem,
    ForkTree,
    FsWatchEvent,
    Process,
    Processes,
    RetryPolicy,
    Sandbox,
    Snapshots,
    StreamEvent,
)

__version__ = "0.1.0"

__all__ = [
    "AsyncFilesystem",
    "AsyncForkTree",
    "AsyncProcess",
    "AsyncProcesses",
    "AsyncSandbox",
    "AsyncSnapshots",
    "CommandFailed",
    "CryoboxError",
    "ExecResult",
    "Filesystem",
    "ForkTree",
    "ForkTreeError",
    "FsWatchEvent",
    "GuestError",
    "HostUnavailable",
    "InvalidArgument",
    "NotFound",
    "PayloadTooLarge",
    "Process",
    "ProcessResult",
    "Processes",
    "PromoteFailure",
    "PromoteResult",
    "QuotaExceeded",
    "RetryPolicy",
    "Sandbox",
    "SandboxTimeout",
    "Snapshot",
    "Snapshots",
    "StateError",
    "StreamEvent",
    "Unauthorized",
    "VmmError",
    "WorkspaceQuotaExceeded",
    "__version__",
]
