"""E2B's code-interpreter protocol over HTTP (stdlib ``http.server``), on the guest's port 49999.

- ``POST /execute`` ``{code, context_id?, language?, env_vars?, timeout?}``: the cell's output as NDJSON, one line
  per output (:mod:`.results`), streamed as the kernel produces it; the response ends when the cell is done.
  Without ``context_id`` the cell runs in the default context. ``timeout`` (seconds, cryobox's extension) interrupts
  the cell; a caller that disconnects interrupts it too.
- ``POST /contexts`` ``{language?, cwd?}`` → ``{id, language, cwd}`` (a spare warm kernel when one is ready);
  ``GET /contexts``; ``DELETE /contexts/{id}``; ``POST /contexts/{id}/restart``.
- ``GET /health``.

Errors are JSON ``{"error": message}`` with 400, 404, 409 or 500; the E2B SDK raises ``NotFoundException`` on 404.
"""

from __future__ import annotations

import functools
import json
import select
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .contexts import INSTANCE_ID_PATH, ContextError, KernelContext, instance_id

DEFAULT_CONTEXT = "default"
MAX_BODY = 16 << 20


class Contexts:
    """Every context of this guest, the default one included, and one spare warm kernel for the next create."""

    def __init__(
        self, *, cwd: str = "/home/user", warm: bool = True, spares: int = 1, instance_path: str = INSTANCE_ID_PATH
    ) -> None:
        self.cwd = cwd
        self._instance = functools.partial(instance_id, instance_path)
        self.warm = warm
        self.spares = spares
        self._lock = threading.Lock()
        self._contexts: dict[str, KernelContext] = {}
        self._spare: list[KernelContext] = []
        self._filling = False

    def start_default(self) -> KernelContext:
        context = KernelContext(
            cwd=self.cwd, context_id=DEFAULT_CONTEXT, warm=self.warm, instance=self._instance
        ).start()
        with self._lock:
            self._contexts[context.id] = context
        return context

    def fill_spares(self) -> None:
        """Start spare kernels up to :attr:`spares` (in the calling thread)."""
        with self._lock:
            if self._filling:
                return
            self._filling = True
        try:
            while True:
                with self._lock:
                    if len(self._spare) >= self.spares:
                        return
                spare = KernelContext(cwd=self.cwd, warm=self.warm, instance=self._instance).start()
                with self._lock:
                    self._spare.append(spare)
        finally:
            with self._lock:
                self._filling = False

    def spares_ready(self) -> bool:
        with self._lock:
            return len(self._spare) >= self.spares

    def create(self, language: str, cwd: str | None) -> KernelContext:
        with self._lock:
            spare = self._spare.pop() if self._spare and language == "python" and cwd in (None, self.cwd) else None
        if spare is not None:
            threading.Thread(target=self.fill_spares, daemon=True, name="kernel-spares").start()
            context = spare
        else:
            context = KernelContext(language, cwd or self.cwd, warm=self.warm, instance=self._instance).start()
        with self._lock:
            self._contexts[context.id] = context
        return context

    def get(self, context_id: str | None) -> KernelContext:
        with self._lock:
            context = self._contexts.get(context_id or DEFAULT_CONTEXT)
        if context is None:
            raise ContextError(404, f"context {context_id} not found")
        return context

    def listed(self) -> list[dict[str, str]]:
        with self._lock:
            return [c.describe() for c in self._contexts.values()]

    def close_all(self) -> None:
        """Shut every kernel down, spares too (the server is stopping)."""
        with self._lock:
            everything = [*self._contexts.values(), *self._spare]
            self._contexts.clear()
            self._spare.clear()
        for context in everything:
            context.shutdown()

    def remove(self, context_id: str) -> None:
        if context_id == DEFAULT_CONTEXT:
            raise ContextError(400, "the default context cannot be removed (restart it instead)")
        with self._lock:
            context = self._contexts.pop(context_id, None)
        if context is None:
            raise ContextError(404, f"context {context_id} not found")
        context.shutdown()


class Handler(BaseHTTPRequestHandler):
    contexts: Contexts  # set on the subclass made by :func:`make_server`
    server_version = "cryobox-kernels/1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        pass

    def _json(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> dict[str, Any]:
        declared = self.headers.get("Content-Length") or "0"
        if not declared.isdigit():
            raise ContextError(400, f"bad Content-Length {declared[:20]!r}")
        length = int(declared)
        if length > MAX_BODY:
            raise ContextError(413, f"body of {length} bytes exceeds {MAX_BODY}")
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw.strip() else {}
        except ValueError as err:
            raise ContextError(400, f"body is not JSON: {err}") from err
        if not isinstance(body, dict):
            raise ContextError(400, "body must be a JSON object")
        return body

    def _guarded(self, action: Callable[[], None]) -> None:
        try:
            action()
        except ContextError as err:
            self._json(err.status, {"error": err.message})
        except (BrokenPipeError, ConnectionResetError):
            pass

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        if self.path.split("?")[0] == "/health":
            self._guarded(lambda: self._json(200, {"status": "ok", "spares_ready": self.contexts.spares_ready()}))
        elif self.path.split("?")[0] == "/contexts":
            self._guarded(lambda: self._json(200, self.contexts.listed()))
        else:
            self._json(404, {"error": f"no route GET {self.path}"})

    def do_DELETE(self) -> None:  # noqa: N802
        parts = self.path.split("?")[0].strip("/").split("/")
        if len(parts) == 2 and parts[0] == "contexts":

            def remove() -> None:
                self.contexts.remove(parts[1])
                self._json(200, {})

            self._guarded(remove)
        else:
            self._json(404, {"error": f"no route DELETE {self.path}"})

    def do_POST(self) -> None:  # noqa: N802
        parts = self.path.split("?")[0].strip("/").split("/")
        if parts == ["execute"]:
            self._guarded(self._execute)
        elif parts == ["contexts"]:
            self._guarded(self._create)
        elif len(parts) == 3 and parts[0] == "contexts" and parts[2] == "restart":

            def restart() -> None:
                self.contexts.get(parts[1]).restart()
                self._json(200, {})

            self._guarded(restart)
        else:
            self._json(404, {"error": f"no route POST {self.path}"})

    def _create(self) -> None:
        body = self._body()
        context = self.contexts.create(str(body.get("language") or "python"), body.get("cwd"))
        self._json(200, context.describe())

    def _execute(self) -> None:
        body = self._body()
        code = body.get("code")
        if not isinstance(code, str):
            raise ContextError(400, "'code' must be a string")
        language = body.get("language")
        if language not in (None, "python") and not body.get("context_id"):
            raise ContextError(400, f"language {language!r} is not available (python is)")
        timeout = body.get("timeout")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0):
            raise ContextError(400, "'timeout' must be a positive number of seconds")
        env = body.get("env_vars") or {}
        if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise ContextError(400, "'env_vars' must map names to strings")
        context = self.contexts.get(body.get("context_id"))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Cache-Control", "no-store")
        self.end_headers()  # HTTP/1.0: the body ends when the connection closes
        self.close_connection = True

        def emit(line: dict[str, Any]) -> None:
            self.wfile.write(json.dumps(line).encode() + b"\n")
            self.wfile.flush()

        def alive() -> bool:
            """Whether the caller is still there (the body is read: a readable socket now means its EOF)."""
            try:
                readable, _, _ = select.select([self.connection], [], [], 0)
                return not readable or bool(self.connection.recv(1, socket.MSG_PEEK))
            except OSError:
                return False

        try:
            limit = float(timeout) if timeout is not None else None
            context.execute(code, emit, timeout_s=limit, env=env, alive=alive)
        except ContextError as err:
            emit({"type": "error", "name": "ContextError", "value": err.message, "traceback": ""})


def make_server(host: str, port: int, contexts: Contexts) -> ThreadingHTTPServer:
    handler = type("BoundHandler", (Handler,), {"contexts": contexts})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server
