"""The IO-free part of background processes, directory watches and port URLs (shared by both clients).

Requests and response parsing of ``/v1/sandboxes/{id}/processes…`` and ``…/fs/watch``, the watch stream's
server-sent events, and :class:`PortUrls` (``get_host`` / ``port_url``, which need no IO at all). A process's
own output stream has the exec stream's events, decoded by :class:`._sse.ExecStreamDecoder`.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
from pydantic import RootModel

from .. import models
from ..errors import GuestError, InvalidArgument
from ..models.procs import signal_number
from ._base import CONNECT_TIMEOUT_S, ClientConfig, parse_model
from ._requests import ApiRequest, _sandbox_path, exec_timeout
from ._sse import SSEDecoder, SSEMessage, stream_error

# --- results ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FsWatchEvent:
    """One event of ``filesystem.watch``: ``start`` once the watch is in place, then ``create``, ``write``,
    ``remove``, ``rename`` or ``chmod`` of ``name`` (relative to the watched directory)."""

    kind: str
    name: str = ""


# --- requests --------------------------------------------------------------------------------------------------


def _process_path(sandbox_id: str, pid: int | None = None, suffix: str = "") -> str:
    return _sandbox_path(sandbox_id, "/processes" + ("" if pid is None else f"/{pid}") + suffix)


def stream_timeout(client_timeout_s: float) -> httpx.Timeout:
    """A stream may stay quiet for as long as its process (or directory) does: no read timeout."""
    return httpx.Timeout(client_timeout_s, connect=CONNECT_TIMEOUT_S, read=None)


def start_request(
    sandbox_id: str,
    cmd: str,
    *,
    env: Mapping[str, str] | None,
    cwd: str | None,
    tag: str | None,
    stdin: bool,
) -> ApiRequest:
    body: dict[str, Any] = {"cmd": cmd, "env": dict(env or {}), "stdin": stdin}
    if cwd is not None:
        body["cwd"] = cwd
    if tag is not None:
        body["tag"] = tag
    return ApiRequest("POST", _process_path(sandbox_id), json=body)


def list_request(sandbox_id: str) -> ApiRequest:
    return ApiRequest("GET", _process_path(sandbox_id))


def stream_request(sandbox_id: str, pid: int, *, client_timeout_s: float) -> ApiRequest:
    return ApiRequest("GET", _process_path(sandbox_id, pid, "/stream"), timeout=stream_timeout(client_timeout_s))


def input_request(sandbox_id: str, pid: int, *, data: str | bytes | None = None, eof: bool = False) -> ApiRequest:
    """Bytes go as ``data_b64``, text UTF-8 encoded the same way (the server sees bytes either way)."""
    body: dict[str, Any] = {"eof": eof}
    if data is not None:
        raw = data.encode() if isinstance(data, str) else bytes(data)
        body["data_b64"] = base64.b64encode(raw).decode()
    return ApiRequest("POST", _process_path(sandbox_id, pid, "/stdin"), json=body)


def signal_request(sandbox_id: str, pid: int, sig: int | str) -> ApiRequest:
    """:raises InvalidArgument: ``sig`` is neither 1-64 nor a signal name (checked before sending)."""
    try:
        number = signal_number(int(sig) if not isinstance(sig, str | bool) else sig)
    except (TypeError, ValueError) as err:
        raise InvalidArgument(f"invalid signal {sig!r}: {err}") from err
    return ApiRequest("POST", _process_path(sandbox_id, pid, "/signal"), json={"signal": number})


def kill_request(sandbox_id: str, pid: int) -> ApiRequest:
    return ApiRequest("DELETE", _process_path(sandbox_id, pid))


def wait_request(sandbox_id: str, pid: int, *, timeout_seconds: float | None, client_timeout_s: float) -> ApiRequest:
    params = {"timeout_seconds": str(timeout_seconds)} if timeout_seconds is not None else None
    return ApiRequest(
        "POST",
        _process_path(sandbox_id, pid, "/wait"),
        params=params,
        timeout=exec_timeout(client_timeout_s, timeout_seconds),
    )


def watch_request(sandbox_id: str, path: str, *, recursive: bool, client_timeout_s: float) -> ApiRequest:
    params = {"path": path, "recursive": "true" if recursive else "false"}
    return ApiRequest(
        "GET", _sandbox_path(sandbox_id, "/fs/watch"), params=params, timeout=stream_timeout(client_timeout_s)
    )


# --- responses -------------------------------------------------------------------------------------------------


def parse_process(response: httpx.Response) -> models.Process:
    return parse_model(models.Process, response)


def parse_process_list(response: httpx.Response) -> list[models.Process]:
    return parse_model(models.ProcessList, response).items


def parse_result(response: httpx.Response) -> models.ProcessResult:
    return parse_model(RootModel[models.ProcessResult], response).root


def stream_ended_early(pid: int) -> GuestError:
    return GuestError(f"the stream of process {pid} ended before the process reported an exit code")


# --- watch streams ---------------------------------------------------------------------------------------------


def decode_watch_message(message: SSEMessage) -> FsWatchEvent:
    """:raises CryoboxError: an ``error`` event (mapped by its ``code``), or malformed data."""
    try:
        data = json.loads(message.data)
    except ValueError as err:
        raise GuestError(f"malformed watch event {message.event!r}: {message.data[:200]!r}") from err
    if not isinstance(data, dict):
        raise GuestError(f"malformed watch event {message.event!r}: {message.data[:200]!r}")
    if message.event == "error":
        raise stream_error(data)
    kind = data.get("kind", message.event)
    name = data.get("name", "")
    return FsWatchEvent(kind=str(kind), name=name if isinstance(name, str) else str(name))


class WatchStreamDecoder:
    """Lines of a watch stream in, :class:`FsWatchEvent` out. Feed ``""`` at end of stream to flush."""

    def __init__(self) -> None:
        self._sse = SSEDecoder()

    def feed(self, line: str) -> FsWatchEvent | None:
        message = self._sse.feed(line)
        return decode_watch_message(message) if message is not None else None


def watch_ended() -> GuestError:
    return GuestError("the watch stream ended without an error event")


# --- ports -----------------------------------------------------------------------------------------------------


class PortUrls:
    """Addresses of a sandbox's ports through the control plane (no IO; mixed into ``Sandbox`` and
    ``AsyncSandbox``). Requests to them need the API key as ``Authorization: Bearer <key>``, like every API call:
    send it yourself (a browser cannot follow such a URL on its own)."""

    _config: ClientConfig

    @property
    def id(self) -> str:
        raise NotImplementedError

    def _port_base(self, port: int) -> str:
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise InvalidArgument(f"port must be 1-65535, got {port!r}")
        return f"{self._config.api_url}{_sandbox_path(self.id, f'/ports/{port}')}"

    def port_url(self, port: int, path: str = "/") -> str:
        """``{api_url}/v1/sandboxes/{id}/ports/{port}{path}``: HTTP (and WebSocket) traffic to ``port`` in the
        guest, proxied by the control plane.

        :raises InvalidArgument: ``port`` is outside 1-65535.
        """
        return self._port_base(port) + (path if path.startswith("/") else f"/{path}")

    def get_host(self, port: int) -> str:
        """``port_url(port)`` without its scheme and trailing slash (``host:8080/v1/sandboxes/{id}/ports/3000``),
        for code that builds ``f"https://{sbx.get_host(port)}/path"`` (E2B style).

        :raises InvalidArgument: ``port`` is outside 1-65535.
        """
        url = urlsplit(self._port_base(port))
        return f"{url.netloc}{url.path}"
