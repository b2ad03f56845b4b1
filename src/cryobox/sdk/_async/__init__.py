"""The asynchronous SDK classes (``sdk/_async`` is hand-written; ``sdk/_sync`` is generated from it)."""

from .sandbox import AsyncFilesystem, AsyncSandbox

__all__ = ["AsyncFilesystem", "AsyncSandbox"]
