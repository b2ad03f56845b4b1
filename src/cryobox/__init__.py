"""cryobox: self-hosted microVM sandboxes where every create is a snapshot restore.

from cryobox import Sandbox

with Sandbox.create(template="code-interpreter") as sbx:
    print(sbx.exec("python3 -c 'print(6 * 7)'").stdout)

``AsyncSandbox`` has the same methods for asyncio (``async with await AsyncSandbox.create() as sbx``).
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
)
from .sdk import AsyncFilesystem, AsyncSandbox, ExecResult, Filesystem, RetryPolicy, Sandbox, StreamEvent

__version__ = "0.1.0"

__all__ = [
    "AsyncFilesystem",
    "AsyncSandbox",
    "CommandFailed",
    "CryoboxError",
    "ExecResult",
    "Filesystem",
    "GuestError",
    "HostUnavailable",
    "InvalidArgument",
    "NotFound",
    "PayloadTooLarge",
    "QuotaExceeded",
    "RetryPolicy",
    "Sandbox",
    "SandboxTimeout",
    "StateError",
    "StreamEvent",
    "Unauthorized",
    "VmmError",
    "__version__",
]
