"""What each MCP tool does, written once on the async SDK and run by both transports.

A call gets an :class:`ApiBinding`: where the API is, the caller's key, and how to open an HTTP client that
carries it. Over stdio that client goes to ``$CRYOBOX_API_URL``; on ``/mcp`` it is an in-process transport to
the control plane app itself. Either way every tool call is an ordinary API request made with the caller's key,
so the API's authentication, workspace scoping, quotas and rate limits apply to it unchanged.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
from mcp import types
from pydantic import ValidationError

from .. import models
from ..errors import InvalidArgument, NotFound
from ..sdk import AsyncSandbox, AsyncSnapshots, ClientConfig
from . import args as a
from .results import failure, invalid_arguments, success


@dataclass(frozen=True)
class ApiBinding:
    """The API as one caller sees it. ``open_client`` returns a fresh client whose requests carry the key; a
    tool call opens one and closes it when it is done."""

    api_url: str
    api_key: str
    open_client: Callable[[], httpx.AsyncClient]


@dataclass(frozen=True)
class _Call:
    binding: ApiBinding
    http: httpx.AsyncClient

    def sandbox(self, sandbox_id: str) -> AsyncSandbox:
        """A handle on ``sandbox_id`` made without a request: the operation's own request is the one the API
        checks (``not_found`` for a sandbox the caller cannot see), so a tool costs what the call it makes costs,
        one request and one rate-limit token."""
        config = ClientConfig.resolve(self.binding.api_url, self.binding.api_key)
        return AsyncSandbox(models.Sandbox.model_construct(id=sandbox_id), config, self.http)

    async def connect(self, sandbox_id: str) -> AsyncSandbox:
        """:raises NotFound: no such sandbox in the caller's workspace."""
        return await AsyncSandbox.connect(
            sandbox_id, api_url=self.binding.api_url, api_key=self.binding.api_key, http=self.http
        )

    async def create(self, **kwargs: Any) -> AsyncSandbox:
        return await AsyncSandbox.create(
            **kwargs, api_url=self.binding.api_url, api_key=self.binding.api_key, http=self.http
        )


def _sandbox(info: models.Sandbox) -> dict[str, Any]:
    return info.model_dump(mode="json")


def _plain(value: Any) -> dict[str, Any]:
    """A dataclass as a dict without its ``None`` fields."""
    return {k: v for k, v in dataclasses.asdict(value).items() if v is not None}


async def create_sandbox(call: _Call, args: a.CreateSandboxArgs) -> dict[str, Any]:
    sbx = await call.create(
        template=args.template, ttl_seconds=args.ttl_seconds, metadata=args.metadata, from_snapshot=args.from_snapshot
    )
    return _sandbox(sbx.info)


async def exec_(call: _Call, args: a.ExecArgs) -> dict[str, Any]:
    sbx = call.sandbox(args.sandbox_id)
    result = await sbx.exec(args.command, timeout_seconds=args.timeout_seconds, env=args.env or None, cwd=args.cwd)
    return {
        "exit_code": result.exit_code,
        "stdout": result.stdout,
        "stderr": result.stderr,
        "duration_ms": result.duration_ms,
    }


async def run_code(call: _Call, args: a.RunCodeArgs) -> dict[str, Any]:
    sbx = call.sandbox(args.sandbox_id)
    execution = await sbx.run_code(args.code, context=args.context_id, timeout_seconds=args.timeout_seconds)
    return {
        "results": [_plain(r) for r in execution.results],
        "text": execution.text,
        "stdout": "".join(execution.logs.stdout),
        "stderr": "".join(execution.logs.stderr),
        "error": None if execution.error is None else dataclasses.asdict(execution.error),
        "execution_count": execution.execution_count,
    }


async def read_file(call: _Call, args: a.ReadFileArgs) -> dict[str, Any]:
    sbx = call.sandbox(args.sandbox_id)
    data = await sbx.filesystem.read(args.path)
    if args.encoding == "base64":
        content = base64.b64encode(data).decode("ascii")
    else:
        try:
            content = data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise InvalidArgument(
                f"{args.path} is not UTF-8 text; read it with encoding 'base64'", details={"path": args.path}
            ) from err
    return {"path": args.path, "encoding": args.encoding, "size": len(data), "content": content}


def decode_content(content: str, encoding: str) -> bytes:
    """:raises InvalidArgument: ``content`` is not valid base64 (for ``encoding`` ``base64``)."""
    if encoding != "base64":
        return content.encode("utf-8")
    try:
        return base64.b64decode(content, validate=True)
    except (binascii.Error, ValueError) as err:
        raise InvalidArgument("content is not valid base64", details={"field": "content"}) from err


async def write_file(call: _Call, args: a.WriteFileArgs) -> dict[str, Any]:
    data = decode_content(args.content, args.encoding)
    sbx = call.sandbox(args.sandbox_id)
    written = await sbx.filesystem.write(args.path, data)
    return {"path": args.path, "bytes": written}


async def list_files(call: _Call, args: a.ListFilesArgs) -> dict[str, Any]:
    sbx = call.sandbox(args.sandbox_id)
    entries = await sbx.filesystem.list(args.path)
    return {"path": args.path, "entries": [e.model_dump(mode="json") for e in entries]}


def snapshot_labels(args: a.SnapshotArgs) -> dict[str, str]:
    return {**args.labels, **({"label": args.label} if args.label is not None else {})}


async def snapshot(call: _Call, args: a.SnapshotArgs) -> dict[str, Any]:
    sbx = call.sandbox(args.sandbox_id)
    return _plain(await sbx.snapshot(snapshot_labels(args), retain=args.retain))


async def restore(call: _Call, args: a.RestoreArgs) -> dict[str, Any]:
    sbx = await call.create(from_snapshot=args.snapshot_id, ttl_seconds=args.ttl_seconds, metadata=args.metadata)
    return _sandbox(sbx.info)


async def fork_tree(call: _Call, args: a.ForkTreeArgs) -> dict[str, Any]:
    sbx = call.sandbox(args.sandbox_id)
    tree = await sbx.fork_tree(args.count, metadata=args.metadata or None)
    return {
        "tree_id": tree.tree_id,
        "parent_id": tree.parent_id,
        "snapshot_id": tree.snapshot_id,
        "children": [_sandbox(child.info) for child in tree.children],
        "errors": [dataclasses.asdict(e) for e in tree.errors],
    }


async def list_sandboxes(call: _Call, args: a.ListSandboxesArgs) -> dict[str, Any]:
    items = await AsyncSandbox.list(
        status=args.status,
        metadata=args.metadata or None,
        api_url=call.binding.api_url,
        api_key=call.binding.api_key,
        http=call.http,
    )
    return {"sandboxes": [_sandbox(info) for info in items]}


async def list_snapshots(call: _Call, args: a.ListSnapshotsArgs) -> dict[str, Any]:
    snapshots = AsyncSnapshots(api_url=call.binding.api_url, api_key=call.binding.api_key, http=call.http)
    items = await snapshots.list(sandbox_id=args.sandbox_id, labels=args.labels or None)
    return {"snapshots": [_plain(s) for s in items]}


async def kill(call: _Call, args: a.KillArgs) -> dict[str, Any]:
    sbx = await call.connect(args.sandbox_id)  # not_found for a sandbox the caller cannot see (kill() ignores it)
    await sbx.kill()
    return {"id": args.sandbox_id, "killed": True}


Runner = Callable[[_Call, Any], Awaitable[dict[str, Any]]]
RUNNERS: Mapping[str, Runner] = {
    "create_sandbox": create_sandbox,
    "exec": exec_,
    "run_code": run_code,
    "read_file": read_file,
    "write_file": write_file,
    "list_files": list_files,
    "snapshot": snapshot,
    "restore": restore,
    "fork_tree": fork_tree,
    "list_sandboxes": list_sandboxes,
    "list_snapshots": list_snapshots,
    "kill": kill,
}


async def call_tool(binding: ApiBinding, name: str, arguments: Mapping[str, Any] | None) -> types.CallToolResult:
    """Run tool ``name``: validate its arguments, call the API, and return its result or its tool error."""
    secrets = [binding.api_key]
    spec = a.SPECS_BY_NAME.get(name)
    runner = RUNNERS.get(name)
    if spec is None or runner is None:
        return failure(NotFound(f"no tool named {name!r}", details={"tool": name}), secrets)
    try:
        parsed = spec.args.model_validate(dict(arguments or {}))
    except ValidationError as err:
        return failure(invalid_arguments(name, err), secrets)
    try:
        async with binding.open_client() as http:
            body = await runner(_Call(binding, http), parsed)
    except Exception as err:
        return failure(err, secrets)
    return success(body, secrets)
