"""cryobox: self-hosted microVM sandboxes where every create is a snapshot restore.

from cryobox import Sandbox

with Sandbox.create(template="code-interpreter") as sbx:
    print(sbx.exec("python3 -c 'print(6 * 7)'").stdout)

``AsyncSandbox`` has the same methods for asyncio (``async with await AsyncSandbox.create() as sbx``).
Snapshots and forks: ``sbx.snapshot()``, ``Sandbox.create(from_snapshot=...)``, ``sbx.fork()``,
``sbx.fork_tree(n)`` and ``Snapshots`` (``AsyncSnapshots``) for the workspace's snapshots. Background
processes: ``sbx.processes.start(cmd)`` or ``sbx.exec(cmd, background=True)`` → ``Process`` (``stream``,
``wait``, ``send_stdin``, ``signal``, ``kill``); directory watches: ``sbx.filesystem.watch(path)``. The code
interpreter (template ``code-interpreter``): ``sbx.run_code(code)`` → ``Execution`` (rich ``Result``s, ``logs``,
``error``), ``sbx.code_contexts`` (``create``, ``list``, ``remove``, ``restart`` of ``CodeContext``s). Network:
``Sandbox.create(network=NetworkPolicy(...))``, ``sbx.set_network(...)`` (replaces the whole policy, live) and
``sbx.egress_log()`` → ``EgressLog`` of ``EgressDecision``s.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from .models import (
        EgressDecision,
        EgressLog,
        ForkTreeError,
        NetworkPolicy,
        ProcessResult,
        PromoteFailure,
        PromoteResult,
        Snapshot,
    )
    from .sdk import (
        AsyncCodeContexts,
        AsyncFilesystem,
        AsyncForkTree,
        AsyncProcess,
        AsyncProcesses,
        AsyncSandbox,
        AsyncSnapshots,
        CodeContext,
        CodeContexts,
        ExecResult,
        Execution,
        ExecutionError,
        Filesystem,
        ForkTree,
        FsWatchEvent,
        Logs,
        Process,
        Processes,
        Result,
        RetryPolicy,
        Sandbox,
        Snapshots,
        StreamEvent,
    )

_LAZY = {
    "EgressDecision": "models",
    "EgressLog": "models",
    "ForkTreeError": "models",
    "NetworkPolicy": "models",
    "ProcessResult": "models",
    "PromoteFailure": "models",
    "PromoteResult": "models",
    "Snapshot": "models",
    "AsyncCodeContexts": "sdk",
    "AsyncFilesystem": "sdk",
    "AsyncForkTree": "sdk",
    "AsyncProcess": "sdk",
    "AsyncProcesses": "sdk",
    "AsyncSandbox": "sdk",
    "AsyncSnapshots": "sdk",
    "CodeContext": "sdk",
    "CodeContexts": "sdk",
    "ExecResult": "sdk",
    "Execution": "sdk",
    "ExecutionError": "sdk",
    "Filesystem": "sdk",
    "ForkTree": "sdk",
    "FsWatchEvent": "sdk",
    "Logs": "sdk",
    "Process": "sdk",
    "Processes": "sdk",
    "Result": "sdk",
    "RetryPolicy": "sdk",
    "Sandbox": "sdk",
    "Snapshots": "sdk",
    "StreamEvent": "sdk",
}
"""The SDK and the models, imported on first use: ``import cryobox.cli.main`` (every ``cryobox`` command) pays
neither httpx nor pydantic unless the command uses them."""

__version__ = "0.1.0"

__all__ = [
    "AsyncCodeContexts",
    "AsyncFilesystem",
    "AsyncForkTree",
    "AsyncProcess",
    "AsyncProcesses",
    "AsyncSandbox",
    "AsyncSnapshots",
    "CodeContext",
    "CodeContexts",
    "CommandFailed",
    "CryoboxError",
    "EgressDecision",
    "EgressLog",
    "ExecResult",
    "Execution",
    "ExecutionError",
    "Filesystem",
    "ForkTree",
    "ForkTreeError",
    "FsWatchEvent",
    "GuestError",
    "HostUnavailable",
    "InvalidArgument",
    "Logs",
    "NetworkPolicy",
    "NotFound",
    "PayloadTooLarge",
    "Process",
    "ProcessResult",
    "Processes",
    "PromoteFailure",
    "PromoteResult",
    "QuotaExceeded",
    "Result",
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


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
