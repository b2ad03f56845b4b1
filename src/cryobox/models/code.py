"""Wire models of the code interpreter (``/v1/sandboxes/{id}/code/…`` and PandaStack's ``…/repl…``), shared by
the server and the SDK.

Imported into :mod:`cryobox.models` (use them from there); kept apart so each file stays one concept. The code runs
in a Jupyter kernel of the sandbox's code-interpreter server (guest port 49999, ``cryobox.guest.kernels``): one
kernel per *context*, state kept across cells, the ``default`` context always there.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

MAX_CODE_CHARS = 8 << 20
"""A cell's source, at most (the guest's server takes 16 MiB bodies)."""
MAX_TIMEOUT_S = 24 * 3600
DEFAULT_TIMEOUT_S = 60.0

# the constraints of ``models.Env`` (not imported from there: that module imports this one)
_EnvKey = Annotated[str, StringConstraints(min_length=1, max_length=256, pattern=r"^[^=\x00]+$")]
_EnvValue = Annotated[str, StringConstraints(max_length=32768, pattern=r"^[^\x00]*$")]
CodeEnv = Annotated[dict[_EnvKey, _EnvValue], Field(max_length=256)]
ContextId = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._-]+$")]

__all__ = [
    "CodeContext",
    "CodeContextList",
    "CodeContextRequest",
    "CodeError",
    "CodeExecution",
    "CodeResult",
    "CodeRunEnd",
    "CodeRunRequest",
    "ReplExecution",
    "ReplRequest",
    "ReplRunRequest",
    "ReplSession",
    "ReplSessionRequest",
]


# --- cryobox's API ---------------------------------------------------------------------------------------------


class CodeRunRequest(BaseModel):
    """``POST /v1/sandboxes/{id}/code/run`` (and ``…/run/stream``): run ``code`` as one cell.

    ``context_id``: the context to run in (default: ``default``). ``timeout_seconds`` interrupts the cell (its
    error is a ``TimeoutError``; the context and its variables survive); ``null`` lets it run as long as it takes.
    ``env`` is set in the kernel's ``os.environ`` before the cell runs.
    """

    model_config = ConfigDict(extra="ignore")
    code: str = Field(max_length=MAX_CODE_CHARS)
    context_id: ContextId | None = None
    timeout_seconds: float | None = Field(default=DEFAULT_TIMEOUT_S, gt=0, le=MAX_TIMEOUT_S)
    env: CodeEnv = Field(default_factory=dict)


class CodeResult(BaseModel):
    """One rich output of a cell: the representations IPython made of an object (a MIME bundle). ``png``,
    ``jpeg`` and ``pdf`` are base64; ``is_main_result`` marks the cell's value (its last expression), as opposed
    to ``display()`` calls and shown figures; MIME types without a field of their own are in ``extra``."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True, serialize_by_alias=True)
    is_main_result: bool = False
    text: str | None = None
    html: str | None = None
    markdown: str | None = None
    svg: str | None = None
    png: str | None = None
    jpeg: str | None = None
    pdf: str | None = None
    latex: str | None = None
    json_data: Any = Field(default=None, alias="json")
    javascript: str | None = None
    extra: dict[str, Any] = Field(default_factory=dict)


class CodeError(BaseModel):
    """The exception a cell raised: its class ``name``, ``value`` (``str(exc)``) and the formatted ``traceback``
    (no terminal colours). A cell interrupted by its timeout has ``name`` ``TimeoutError``."""

    name: str
    value: str
    traceback: str = ""


class CodeExecution(BaseModel):
    """What one cell did: its results, everything it printed, its error (``null`` when it ran through), the
    context's execution count after it and the control plane's measure of its duration."""

    results: list[CodeResult] = Field(default_factory=list)
    stdout: str = ""
    stderr: str = ""
    error: CodeError | None = None
    execution_count: int | None = None
    duration_ms: float = 0.0


class CodeRunEnd(BaseModel):
    """The ``end`` event of ``…/code/run/stream``: the cell is done."""

    execution_count: int | None = None
    duration_ms: float = 0.0


class CodeContextRequest(BaseModel):
    """``POST /v1/sandboxes/{id}/code/contexts``: a new kernel (``python`` only, for now) working in ``cwd``
    (default: the user's home)."""

    model_config = ConfigDict(extra="ignore")
    language: str = Field(default="python", min_length=1, max_length=64)
    cwd: str | None = Field(default=None, min_length=1, max_length=4096)


class CodeContext(BaseModel):
    model_config = ConfigDict(extra="ignore")
    id: str
    language: str = "python"
    cwd: str = ""


class CodeContextList(BaseModel):
    items: list[CodeContext]


# --- PandaStack's API ------------------------------------------------------------------------------------------


class ReplSessionRequest(BaseModel):
    """``POST /v1/sandboxes/{id}/repl/sessions`` (PandaStack's ``create_code_context``)."""

    model_config = ConfigDict(extra="ignore")
    language: str = Field(default="python", min_length=1, max_length=64)


class ReplSession(BaseModel):
    id: str
    language: str


class ReplRunRequest(BaseModel):
    """``POST …/repl/sessions/{sid}/run``: ``timeout_ms`` interrupts the cell (default 60 s); a timed-out cell is a
    504 ``timeout`` (PandaStack's SDK raises ``SandboxTimeout``), and the session keeps its state."""

    model_config = ConfigDict(extra="ignore")
    code: str = Field(max_length=MAX_CODE_CHARS)
    timeout_ms: int | None = Field(default=None, gt=0, le=MAX_TIMEOUT_S * 1000)


class ReplRequest(ReplRunRequest):
    """``POST /v1/sandboxes/{id}/repl``: one cell in the sandbox's default context."""

    language: str | None = Field(default=None, min_length=1, max_length=64)


class ReplExecution(BaseModel):
    """PandaStack's ``Execution``: ``results`` are MIME bundles (``{"text/plain": …, "image/png": <base64>}``),
    ``error`` the formatted traceback (``null`` when the cell ran through), ``exit_code`` 1 when it raised."""

    results: list[dict[str, str]] = Field(default_factory=list)
    stdout: str = ""
    stderr: str = ""
    error: str | None = None
    exit_code: int = 0
    duration_ms: int = 0
