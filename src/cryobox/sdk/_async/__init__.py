"""The asynchronous SDK classes (``sdk/_async`` is hand-written; ``sdk/_sync`` is generated from it)."""

from .filesystem import AsyncFilesystem
from .processes import AsyncProcess, AsyncProcesses
from .sandbox import AsyncSandbox
from .snapshots import AsyncForkTree, AsyncSnapshots
from .templates import AsyncBuild, AsyncTemplates
from .volumes import AsyncVolumes

__all__ = [
    "AsyncBuild",
    "AsyncFilesystem",
    "AsyncForkTree",
    "AsyncProcess",
    "AsyncProcesses",
    "AsyncSandbox",
    "AsyncSnapshots",
    "AsyncTemplates",
    "AsyncVolumes",
]
