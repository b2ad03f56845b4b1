"""The integration tests' ways into a running ``cryobox serve``: the SDK's keyword arguments (:class:`Api`), the
``cryobox`` command line (:func:`cli`), a fresh API key for a workspace (:func:`new_key`) and a raw HTTP client
(:class:`Client`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, TypedDict

import httpx


class Api(TypedDict):
    """Keyword arguments that point SDK calls at the test server."""

    api_url: str
    api_key: str


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``cryobox`` in a subprocess (``env`` is added to this process's environment)."""
    return subprocess.run(
        [sys.executable, "-m", "cryobox.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def new_key(data_dir: Path, workspace: str) -> str:
    """A fresh API key for ``workspace`` (created if missing) of the server using ``data_dir``."""
    done = cli("keys", "create", "--workspace", workspace, "--data-dir", str(data_dir), "--json")
    assert done.returncode == 0, done.stderr
    key: str = json.loads(done.stdout)["key"]
    return key


class Client:
    """A thin httpx client for the raw HTTP API: ``call`` asserts the status and returns the JSON body."""

    def __init__(self, url: str, key: str, timeout: float = 300.0) -> None:
        self.http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=timeout)
        self.created: list[str] = []

    def call(self, method: str, path: str, status: int = 200, **kwargs: Any) -> Any:
        response = self.http.request(method, path, **kwargs)
        assert response.status_code == status, f"{method} {path}: {response.status_code} {response.text}"
        return response.json() if response.content else None

    def create(self, status: int = 201, **body: Any) -> dict[str, Any]:
        sandbox: dict[str, Any] = self.call("POST", "/v1/sandboxes", status, json={"template": "base", **body})
        self.track(sandbox)
        return sandbox

    def track(self, *sandboxes: dict[str, Any]) -> None:
        """Delete these sandboxes in :meth:`close`."""
        self.created.extend(s["id"] for s in sandboxes if "id" in s)

    def sh(self, sandbox_id: str, cmd: str, timeout: int = 120) -> str:
        """Run ``cmd`` in the sandbox; it must exit 0. Returns stdout."""
        result = self.call("POST", f"/v1/sandboxes/{sandbox_id}/exec", json={"cmd": cmd, "timeout_seconds": timeout})
        assert result["exit_code"] == 0, result
        out: str = result["stdout"]
        return out

    def snapshot(self, sandbox_id: str, **body: Any) -> dict[str, Any]:
        snap: dict[str, Any] = self.call("POST", f"/v1/sandboxes/{sandbox_id}/snapshots", 201, json=body)
        return snap

    def delete(self, sandbox_id: str, **params: Any) -> None:
        response = self.http.delete(f"/v1/sandboxes/{sandbox_id}", params=params)
        assert response.status_code in (204, 404), response.text

    def close(self) -> None:
        """Delete every sandbox this client made (keeping snapshots marked ``retain``), then disconnect."""
        for sandbox_id in self.created:
            self.http.delete(f"/v1/sandboxes/{sandbox_id}")
        self.http.close()
