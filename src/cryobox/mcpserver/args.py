"""The MCP tools' arguments: one pydantic model per tool. Its JSON schema (with the fields' descriptions) is
the tool's ``inputSchema``; validating a call's arguments against it is the first thing a call does, so a bad
argument is an ``invalid_argument`` tool error in the API's shape (never a protocol error, never a 500)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_TTL_S = 30 * 24 * 3600


def _sandbox_id() -> Any:
    return Field(min_length=1, max_length=128, description="the sandbox's id (from create_sandbox or list_sandboxes)")


Encoding = Literal["utf-8", "base64"]


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CreateSandboxArgs(_Args):
    template: str = Field(
        default="code-interpreter",
        min_length=1,
        max_length=128,
        description="template to restore: 'base' (a shell), 'code-interpreter' (Jupyter kernels) or a custom one",
    )
    ttl_seconds: int | None = Field(
        default=None, ge=1, le=MAX_TTL_S, description="seconds until the sandbox is deleted (default: the server's)"
    )
    metadata: dict[str, str] = Field(default_factory=dict, description="free-form labels, filterable on list")
    from_snapshot: str | None = Field(
        default=None, min_length=1, description="restore this snapshot instead of the template (memory and disk)"
    )


class ExecArgs(_Args):
    sandbox_id: str = _sandbox_id()
    command: str = Field(min_length=1, description="a shell command line, run with /bin/sh -c")
    timeout_seconds: float = Field(
        default=60.0, gt=0, le=3600, description="kill the command's process group after this many seconds"
    )
    cwd: str | None = Field(default=None, min_length=1, description="working directory (default: the user's home)")
    env: dict[str, str] = Field(default_factory=dict, description="extra environment variables")


class RunCodeArgs(_Args):
    sandbox_id: str = _sandbox_id()
    code: str = Field(description="the cell to run (a sandbox of template 'code-interpreter')")
    language: Literal["python"] = Field(default="python", description="the kernel's language")
    context_id: str | None = Field(
        default=None, min_length=1, description="the code context (kernel) to run in (default: 'default')"
    )
    timeout_seconds: float = Field(
        default=60.0, gt=0, le=3600, description="interrupt the cell after this many seconds (its state survives)"
    )


class ReadFileArgs(_Args):
    sandbox_id: str = _sandbox_id()
    path: str = Field(min_length=1, description="absolute guest path of the file")
    encoding: Encoding = Field(
        default="utf-8", description="'utf-8' returns text (a file that is not UTF-8 is an error), 'base64' any bytes"
    )


class WriteFileArgs(_Args):
    sandbox_id: str = _sandbox_id()
    path: str = Field(min_length=1, description="absolute guest path; parent directories are created")
    content: str = Field(description="the file's content, encoded as 'encoding' says")
    encoding: Encoding = Field(default="utf-8", description="'utf-8': content is text; 'base64': content is base64")


class ListFilesArgs(_Args):
    sandbox_id: str = _sandbox_id()
    path: str = Field(min_length=1, description="absolute guest path of a directory")


class SnapshotArgs(_Args):
    sandbox_id: str = _sandbox_id()
    label: str | None = Field(
        default=None, min_length=1, max_length=256, description="stored as the snapshot's label 'label'"
    )
    labels: dict[str, str] = Field(default_factory=dict, description="more labels (key -> value)")
    retain: bool = Field(default=False, description="keep the snapshot when its sandbox is killed")


class RestoreArgs(_Args):
    snapshot_id: str = Field(min_length=1, max_length=128, description="the snapshot to restore (a new sandbox)")
    ttl_seconds: int | None = Field(default=None, ge=1, le=MAX_TTL_S, description="seconds until it is deleted")
    metadata: dict[str, str] = Field(default_factory=dict, description="the new sandbox's labels")


class ForkTreeArgs(_Args):
    sandbox_id: str = _sandbox_id()
    count: int = Field(default=2, ge=1, le=16, description="children to restore from one snapshot of the sandbox")
    metadata: dict[str, str] = Field(default_factory=dict, description="labels of every child")


class ListSandboxesArgs(_Args):
    status: Literal["starting", "running", "paused", "hibernated", "stopped", "error", "lost"] | None = Field(
        default=None, description="only sandboxes in this state"
    )
    metadata: dict[str, str] = Field(default_factory=dict, description="only sandboxes whose metadata contains these")


class ListSnapshotsArgs(_Args):
    sandbox_id: str | None = Field(default=None, min_length=1, description="only this sandbox's snapshots")
    labels: dict[str, str] = Field(default_factory=dict, description="only snapshots whose labels contain these")


class KillArgs(_Args):
    sandbox_id: str = _sandbox_id()


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    args: type[_Args]

    def input_schema(self) -> dict[str, Any]:
        return self.args.model_json_schema()


TOOL_SPECS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "create_sandbox", "Create a sandbox (a microVM restored from a template or a snapshot).", CreateSandboxArgs
    ),
    ToolSpec("exec", "Run a shell command in a sandbox and wait for it: exit_code, stdout, stderr.", ExecArgs),
    ToolSpec(
        "run_code",
        "Run a Python cell in a code-interpreter sandbox's stateful kernel: results, stdout, stderr, error.",
        RunCodeArgs,
    ),
    ToolSpec("read_file", "Read a file from a sandbox.", ReadFileArgs),
    ToolSpec("write_file", "Write a file in a sandbox (creating parent directories).", WriteFileArgs),
    ToolSpec("list_files", "List a directory in a sandbox.", ListFilesArgs),
    ToolSpec("snapshot", "Snapshot a sandbox's memory and disk; it keeps running.", SnapshotArgs),
    ToolSpec("restore", "Create a new sandbox from a snapshot (memory and disk as they were).", RestoreArgs),
    ToolSpec("fork_tree", "Restore count children from one snapshot of a sandbox, to try alternatives.", ForkTreeArgs),
    ToolSpec("list_sandboxes", "List the workspace's sandboxes.", ListSandboxesArgs),
    ToolSpec("list_snapshots", "List the workspace's snapshots, newest first.", ListSnapshotsArgs),
    ToolSpec("kill", "Delete a sandbox (and its snapshots that are not retained).", KillArgs),
)
SPECS_BY_NAME = {spec.name: spec for spec in TOOL_SPECS}
