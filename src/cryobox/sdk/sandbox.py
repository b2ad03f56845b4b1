"""``Sandbox``: the synchronous SDK object for one sandbox.

Example::

    from cryobox import Sandbox

    with Sandbox.create(template="base") as sbx:
        sbx.filesystem.write("/work/task.py", "print(6 * 7)")
        print(sbx.exec("python3 /work/task.py").stdout)   # "42\\n"
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import httpx

from .. import models
from ..errors import CommandFailed, CryoboxError
from ._transport import ClientConfig, raise_for_error


@dataclass(frozen=True)
class ExecResult:
    stdout: str
    stderr: str
    exit_code: int
    duration_ms: float


@dataclass(frozen=True)
class StreamEvent:
    """``kind`` is ``stdout``, ``stderr`` (with ``chunk``) or ``exit`` (with ``exit_code``)."""

    kind: str
    chunk: str = ""
    exit_code: int | None = None


class Filesystem:
    def __init__(self, sandbox: Sandbox) -> None:
        self._sbx = sandbox

    def _url(self, suffix: str = "") -> str:
        return f"/v1/sandboxes/{self._sbx.id}/fs{suffix}"

    def read(self, path: str) -> bytes:
        response = self._sbx._http.get(self._url(), params={"path": path})
        raise_for_error(response)
        return response.content

    def read_text(self, path: str, encoding: str = "utf-8") -> str:
        return self.read(path).decode(encoding)

    def write(self, path: str, data: str | bytes) -> int:
        payload = data.encode() if isinstance(data, str) else data
        response = self._sbx._http.put(
            self._url(),
            params={"path": path},
            content=payload,
            headers={"Content-Type": "application/octet-stream"},
        )
        raise_for_error(response)
        return int(response.json()["bytes"])

    def list(self, path: str) -> list[models.FileEntry]:
        response = self._sbx._http.get(self._url("/dir"), params={"path": path})
        raise_for_error(response)
        return models.DirListing.model_validate(response.json()).entries

    def stat(self, path: str) -> models.FileEntry:
        response = self._sbx._http.get(self._url("/stat"), params={"path": path})
        raise_for_error(response)
        return models.FileEntry.model_validate(response.json())

    def exists(self, path: str) -> bool:
        try:
            self.stat(path)
        except CryoboxError as err:
            if err.code == "not_found":
                return False
            raise
        return True

    def remove(self, path: str) -> None:
        response = self._sbx._http.delete(self._url(), params={"path": path})
        raise_for_error(response)


class Sandbox:
    def __init__(self, info: models.Sandbox, config: ClientConfig, http: httpx.Client | None = None) -> None:
        self.info = info
        self._config = config
        self._http = http or config.client()
        self.filesystem = Filesystem(self)

    @property
    def id(self) -> str:
        return self.info.id

    def __repr__(self) -> str:
        return f"Sandbox({self.id!r}, template={self.info.template!r}, status={self.info.status!r})"

    @classmethod
    def create(
        cls,
        template: str = "code-interpreter",
        *,
        ttl_seconds: int | None = None,
        persistent: bool = False,
        metadata: dict[str, str] | None = None,
        env: dict[str, str] | None = None,
        api_url: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 300.0,
    ) -> Sandbox:
        config = ClientConfig.resolve(api_url, api_key, timeout_s)
        http = config.client()
        body: dict[str, Any] = {
            "template": template,
            "persistent": persistent,
            "metadata": metadata or {},
            "env": env or {},
        }
        if ttl_seconds is not None:
            body["ttl_seconds"] = ttl_seconds
        try:
            response = http.post("/v1/sandboxes", json=body)
            raise_for_error(response)
        except BaseException:
            http.close()
            raise
        return cls(models.Sandbox.model_validate(response.json()), config, http)

    @classmethod
    def connect(cls, sandbox_id: str, *, api_url: str | None = None, api_key: str | None = None) -> Sandbox:
        config = ClientConfig.resolve(api_url, api_key)
        http = config.client()
        try:
            response = http.get(f"/v1/sandboxes/{sandbox_id}")
            raise_for_error(response)
        except BaseException:
            http.close()
            raise
        return cls(models.Sandbox.model_validate(response.json()), config, http)

    @staticmethod
    def list(*, api_url: str | None = None, api_key: str | None = None) -> list[models.Sandbox]:
        config = ClientConfig.resolve(api_url, api_key)
        with config.client() as http:
            response = http.get("/v1/sandboxes")
            raise_for_error(response)
            return models.SandboxList.model_validate(response.json()).items

    def refresh(self) -> models.Sandbox:
        response = self._http.get(f"/v1/sandboxes/{self.id}")
        raise_for_error(response)
        self.info = models.Sandbox.model_validate(response.json())
        return self.info

    @staticmethod
    def _exec_body(
        cmd: str, timeout_seconds: float | None, env: dict[str, str] | None, cwd: str | None, stdin: str | None
    ) -> dict[str, Any]:
        return {"cmd": cmd, "timeout_seconds": timeout_seconds, "env": env or {}, "cwd": cwd, "stdin": stdin}

    def exec(
        self,
        cmd: str,
        *,
        timeout_seconds: float | None = 60.0,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        stdin: str | None = None,
        check: bool = False,
    ) -> ExecResult:
        """Run ``cmd`` with ``/bin/sh -c`` in the sandbox.

        :raises SandboxTimeout: the command ran past ``timeout_seconds`` (its process group was killed).
        :raises CommandFailed: ``check`` is set and the exit code is not 0.
        """
        response = self._http.post(
            f"/v1/sandboxes/{self.id}/exec", json=self._exec_body(cmd, timeout_seconds, env, cwd, stdin)
        )
        raise_for_error(response)
        body = response.json()
        result = ExecResult(
            stdout=body["stdout"],
            stderr=body["stderr"],
            exit_code=int(body["exit_code"]),
            duration_ms=float(body["duration_ms"]),
        )
        if check and result.exit_code != 0:
            raise CommandFailed(
                f"command exited with {result.exit_code}: {cmd}",
                exit_code=result.exit_code,
                stdout=result.stdout,
                stderr=result.stderr,
            )
        return result

    def exec_stream(
        self,
        cmd: str,
        *,
        timeout_seconds: float | None = 60.0,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        stdin: str | None = None,
    ) -> Iterator[StreamEvent]:
        """Yield output chunks as the command produces them, then one ``exit`` event."""
        body = self._exec_body(cmd, timeout_seconds, env, cwd, stdin)
        with self._http.stream("POST", f"/v1/sandboxes/{self.id}/exec/stream", json=body) as response:
            if response.status_code >= 400:
                response.read()
                raise_for_error(response)
            event = ""
            for line in response.iter_lines():
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    data = json.loads(line[5:])
                    if event == "exit":
                        yield StreamEvent(kind="exit", exit_code=int(data["exit_code"]))
                        return
                    if event == "error":
                        raise CryoboxError(str(data.get("error")), details=data)
                    yield StreamEvent(kind=event, chunk=str(data.get("chunk", "")))

    def close(self) -> None:
        """Release this client's HTTP connections; the sandbox keeps running."""
        self._http.close()

    def kill(self) -> None:
        """Delete the sandbox. Killing an already-deleted sandbox is not an error."""
        try:
            response = self._http.delete(f"/v1/sandboxes/{self.id}")
            if response.status_code != 404:
                raise_for_error(response)
        finally:
            self._http.close()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.kill()
