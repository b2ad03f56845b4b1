"""envd's REST routes: ``GET /files`` (download), ``POST /files`` (upload), ``GET /health``.

- Download: ``?path=&username=`` (relative paths under the user's home); the raw bytes as
  ``application/octet-stream``, gzip-encoded when ``Accept-Encoding`` asks for it. A missing file is a 404, a
  directory a 400, as in envd.
- Upload: ``application/octet-stream`` (the SDK's default since envd 0.5.7; ``path`` required,
  ``Content-Encoding: gzip`` decoded) or ``multipart/form-data`` with one or more ``file`` parts, each written to
  ``path`` when given (one file) or to its part's file name (the SDK's ``write_files``). The answer is what the
  SDK parses: ``[{"name", "type": "file", "path"}]``. Files are at most ``MAX_FILE_BYTES`` each (413 beyond);
  ``X-Metadata-*`` headers (file metadata in xattrs) are refused with a 400, the guest has no such op.
- Health: 204 while the sandbox runs, 502 "was not found" otherwise (the SDK's ``is_running()`` and the probe it
  makes after a dropped connection).

Downloads and uploads take the sandbox's access token (``X-Access-Token``) or, without it, a signed URL
(``signature``, ``signature_expiration``, :mod:`..signing`): what the SDK's ``download_url``/``upload_url`` build,
checked before anything is read or written (a wrong or expired one is a 401).

Errors are envd's JSON (``{"code": <status>, "message": ...}``, :func:`~.errors.envd_error`).
"""

from __future__ import annotations

import asyncio
import gzip
import json
import posixpath
import urllib.parse
import zlib
from collections.abc import Mapping
from typing import Any

from starlette.types import Receive, Scope, Send

from ....agentapi import MAX_FILE_BYTES
from ....errors import InvalidArgument, NotFound, PayloadTooLarge
from ..access import SANDBOX_HEADER, TOKEN_HEADER
from ..signing import READ, WRITE, Operation, from_query
from . import multipart
from .errors import envd_error
from .session import DEFAULT_USER, USABLE_STATES, SandboxOpener, SandboxUnavailable, Target, open_sandbox, open_target

MULTIPART_OVERHEAD = 1 << 20
METADATA_PREFIX = "x-metadata-"


class ClientGone(Exception):
    """The client went away before its request body was read."""


def header_map(scope: Scope) -> dict[str, str]:
    """The request's headers by lower-cased name (the first of repeated ones)."""
    headers: dict[str, str] = {}
    for key, value in scope.get("headers", ()):
        headers.setdefault(key.decode("latin-1").lower(), value.decode("latin-1"))
    return headers


def query_map(scope: Scope) -> dict[str, str]:
    raw = scope.get("query_string", b"").decode("utf-8", errors="replace")
    return {k: v[0] for k, v in urllib.parse.parse_qs(raw, keep_blank_values=True).items()}


async def send_response(
    send: Send, status: int, body: bytes, content_type: str | None, headers: list[tuple[str, str]] | None = None
) -> None:
    raw = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers or []]
    if content_type is not None:
        raw.append((b"content-type", content_type.encode("latin-1")))
    raw.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_json(send: Send, status: int, value: Any, headers: list[tuple[str, str]] | None = None) -> None:
    await send_response(send, status, json.dumps(value).encode(), "application/json", headers)


async def send_error(send: Send, exc: Exception) -> None:
    status, body, headers = envd_error(exc)
    await send_json(send, status, body, headers)


async def read_body(receive: Receive, limit: int) -> bytes:
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone()
        body += message.get("body", b"")
        if len(body) > limit:
            raise PayloadTooLarge(f"request body exceeds {limit} bytes", details={"limit": limit})
        if not message.get("more_body", False):
            return bytes(body)


def _gunzip(data: bytes, limit: int) -> bytes:
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        out = inflater.decompress(data, limit + 1)
    except zlib.error as err:
        raise InvalidArgument(f"error decompressing request body: {err}") from err
    if len(out) > limit:
        raise PayloadTooLarge(f"decompressed body exceeds {limit} bytes", details={"limit": limit})
    if not inflater.eof:
        raise InvalidArgument("error decompressing request body: truncated gzip stream")
    return out


def accepts_gzip(accept_encoding: str | None) -> bool:
    for item in (accept_encoding or "").split(","):
        coding, _, params = item.strip().partition(";")
        if coding.strip().lower() != "gzip":
            continue
        q = params.strip().removeprefix("q=").strip() if params.strip().startswith("q=") else "1"
        try:
            return float(q) > 0
        except ValueError:
            return False
    return False


def written(path: str) -> dict[str, str]:
    return {"name": posixpath.basename(path), "type": "file", "path": path}


class EnvdFiles:
    """The REST side of envd (the paths below the mount: ``/files``, ``/health``)."""

    def __init__(
        self, opener: SandboxOpener, *, default_user: str = DEFAULT_USER, max_file_bytes: int = MAX_FILE_BYTES
    ) -> None:
        self._opener = opener
        self._default_user = default_user
        self._max = max_file_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send, route: str) -> None:
        method = scope.get("method", "GET")
        try:
            if route == "/health" and method == "GET":
                await self._health(scope, send)
            elif route == "/files" and method == "GET":
                await self._download(scope, send)
            elif route == "/files" and method == "POST":
                await self._upload(scope, receive, send)
            elif route in ("/health", "/files"):
                await send_json(send, 405, {"code": 405, "message": f"method {method} not allowed"})
            else:
                raise NotFound(f"no route {route}")
        except ClientGone:
            return
        except Exception as exc:
            await send_error(send, exc)

    async def _target(self, scope: Scope, operation: Operation) -> tuple[Target, dict[str, str]]:
        headers, query = header_map(scope), query_map(scope)
        signed = from_query(query, operation)
        user = query.get("username") or self._default_user
        target = await open_target(self._opener, headers, user=user, default_user=self._default_user, signed=signed)
        return target, query

    async def _health(self, scope: Scope, send: Send) -> None:
        headers = header_map(scope)
        sandbox_id = headers.get(SANDBOX_HEADER)
        row, _ = await open_sandbox(self._opener, sandbox_id, headers.get(TOKEN_HEADER), wake=False)
        if row.status not in USABLE_STATES:
            raise SandboxUnavailable(f"sandbox {sandbox_id} was not found running: it is {row.status}")
        await send_response(send, 204, b"", None)

    async def _download(self, scope: Scope, send: Send) -> None:
        target, query = await self._target(scope, READ)
        data = await target.agent.read_file(target.sandbox_id, target.resolve(query.get("path", "")))
        headers = [("vary", "Accept-Encoding")]
        if accepts_gzip(header_map(scope).get("accept-encoding")):
            data = await asyncio.to_thread(gzip.compress, data, 6)
            headers.append(("content-encoding", "gzip"))
        await send_response(send, 200, data, "application/octet-stream", headers)

    async def _upload(self, scope: Scope, receive: Receive, send: Send) -> None:
        target, query = await self._target(scope, WRITE)
        headers = header_map(scope)
        if any(name.startswith(METADATA_PREFIX) for name in headers):
            raise InvalidArgument("file metadata (X-Metadata-* headers) is not supported by this sandbox")
        media, _ = multipart.header_params(headers.get("content-type", ""))
        if media == "application/octet-stream":
            files = [(query.get("path"), await self._body(receive, headers, self._max))]
            if not files[0][0]:
                raise InvalidArgument("path query parameter is required for raw body upload")
        elif media.startswith("multipart/"):
            body = await self._body(receive, headers, self._max + MULTIPART_OVERHEAD)
            parts = multipart.parse(body, headers.get("content-type", ""))
            files = [(query.get("path") or part.filename, part.content) for part in parts if part.name == "file"]
        else:
            raise InvalidArgument(
                f"unsupported content type: {media or '(none)'}, expected multipart/form-data or "
                "application/octet-stream"
            )
        await send_json(send, 200, await self._write_all(target, files))

    async def _body(self, receive: Receive, headers: Mapping[str, str], limit: int) -> bytes:
        declared = headers.get("content-length", "")
        gzipped = headers.get("content-encoding", "").strip().lower() == "gzip"
        if declared.isdigit() and int(declared) > limit and not gzipped:
            raise PayloadTooLarge(f"request body of {declared} bytes exceeds {limit}", details={"limit": limit})
        body = await read_body(receive, limit)
        return await asyncio.to_thread(_gunzip, body, limit) if gzipped else body

    async def _write_all(self, target: Target, files: list[tuple[str | None, bytes]]) -> list[dict[str, str]]:
        paths: list[str] = []
        for name, content in files:
            if not name:
                raise InvalidArgument("a file part has no file name and the request no path")
            path = target.resolve(name)
            if path in paths:
                raise InvalidArgument(f"you cannot upload multiple files to the same path '{path}' in one request")
            if len(content) > self._max:
                raise PayloadTooLarge(f"file {path} of {len(content)} bytes exceeds {self._max}")
            paths.append(path)
        out: list[dict[str, str]] = []
        for path, (_, content) in zip(paths, files, strict=True):
            await target.agent.write_file(target.sandbox_id, path, content, user=target.user)
            out.append(written(path))
        return out
