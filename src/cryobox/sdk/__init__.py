"""Python SDK over the public HTTP API: ``Sandbox`` / ``Snapshots`` (sync) and ``AsyncSandbox`` /
``AsyncSnapshots`` (asyncio); a sandbox's background processes are ``Process`` / ``AsyncProcess``
(``sbx.processes``); its code interpreter is ``sbx.run_code`` → ``Execution`` and ``sbx.code_contexts``
(``CodeContexts`` / ``AsyncCodeContexts`` of ``CodeContext``); templates are built from a Dockerfile or an image
by ``Templates`` / ``AsyncTemplates`` (a ``Build`` / ``AsyncBuild`` each).

Both are built from one implementation: ``_async/`` is written by hand, ``_sync/`` is generated from it by
``scripts/unasync.py``, and the wire logic they share (requests, parsing, errors, retry planning) is in
``_base.py``, ``_requests.py``, ``_snapshots.py``, ``_procs.py`` and ``_code.py``.
"""

from ..models import (
    EgressDecision,
    EgressLog,
    ForkTreeError,
    NetworkPolicy,
    ProcessResult,
    PromoteFailure,
    PromoteResult,
    Snapshot,
)
from ._async import (
    AsyncBuild,
    AsyncFilesystem,
    AsyncForkTree,
    AsyncProcess,
    AsyncProcesses,
    AsyncSandbox,
    AsyncSnapshots,
    AsyncTemplates,
    AsyncVolumes,
)
from ._async.code import AsyncCodeContexts
from ._base import ClientConfig, ExecResult, Lifecycle, RetryPolicy, StreamEvent
from ._code import CodeContext, Execution, ExecutionError, Logs, Result
from ._procs import FsWatchEvent
from ._sync import Build, Filesystem, ForkTree, Process, Processes, Sandbox, Snapshots, Templates, Volumes
from ._sync.code import CodeContexts

__all__ = [
    "AsyncBuild",
    "AsyncCodeContexts",
    "AsyncFilesystem",
    "AsyncForkTree",
    "AsyncProcess",
    "AsyncProcesses",
    "AsyncSandbox",
    "AsyncSnapshots",
    "AsyncTemplates",
    "AsyncVolumes",
    "Build",
    "ClientConfig",
    "CodeContext",
    "CodeContexts",
    "EgressDecision",
    "EgressLog",
    "ExecResult",
    "Execution",
    "ExecutionError",
    "Filesystem",
    "ForkTree",
    "ForkTreeError",
    "FsWatchEvent",
    "Lifecycle",
    "Logs",
    "NetworkPolicy",
    "Process",
    "ProcessResult",
    "Processes",
    "PromoteFailure",
    "PromoteResult",
    "Result",
    "RetryPolicy",
    "Sandbox",
    "Snapshot",
    "Snapshots",
    "StreamEvent",
    "Templates",
    "Volumes",
]
