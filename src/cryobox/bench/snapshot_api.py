"""A plain ``/v1`` client for the snapshot bench (and the others that reuse it)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import httpx
from rich.console import Console

from .snapshot_report import BenchError


class Api:
    """A plain ``httpx`` client for ``/v1`` that remembers what it created so :meth:`cleanup` can delete it."""

    def __init__(self, url: str, api_key: str) -> None:
        self.http = httpx.Client(
            base_url=url,
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=httpx.Timeout(600.0, connect=10.0),
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=64),
        )
        self.sandboxes: list[str] = []
        self.snapshots: list[str] = []
        self.templates: list[str] = []

    def call(self, method: str, path: str, expect: int, body: dict[str, Any] | None = None) -> Any:
        try:
            resp = self.http.request(method, path, json=body)
        except httpx.HTTPError as err:
            raise BenchError(f"{method} {path} failed: {err!r}") from err
        if resp.status_code != expect:
            raise BenchError(f"{method} {path} -> HTTP {resp.status_code} (expected {expect}): {resp.text[:2000]}")
        return resp.json() if resp.content else None

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        sbx: dict[str, Any] = self.call("POST", "/v1/sandboxes", 201, body)
        self.sandboxes.append(sbx["id"])
        return sbx

    def exec(self, sandbox_id: str, cmd: str, timeout_s: float = 300.0) -> dict[str, Any]:
        out: dict[str, Any] = self.call(
            "POST", f"/v1/sandboxes/{sandbox_id}/exec", 200, {"cmd": cmd, "timeout_seconds": timeout_s}
        )
        if out["exit_code"] != 0:
            tail = out["stderr"][-2000:] or out["stdout"][-2000:]
            raise BenchError(f"exec {cmd!r} in {sandbox_id} exited {out['exit_code']}: {tail}")
        return out

    def snapshot(self, sandbox_id: str, *, retain: bool = False) -> dict[str, Any]:
        """``retain``: the snapshot outlives its sandbox (otherwise deleting the sandbox deletes it)."""
        snap: dict[str, Any] = self.call(
            "POST", f"/v1/sandboxes/{sandbox_id}/snapshots", 201, {"labels": {}, "retain": retain}
        )
        self.snapshots.append(snap["id"])
        return snap

    def fork_tree(self, sandbox_id: str, count: int) -> dict[str, Any]:
        tree: dict[str, Any] = self.call("POST", f"/v1/sandboxes/{sandbox_id}/fork-tree", 201, {"count": count})
        self.snapshots.append(tree["snapshot_id"])
        self.sandboxes.extend(child["id"] for child in tree["children"])
        return tree

    def delete_sandbox(self, sandbox_id: str) -> None:
        self.call("DELETE", f"/v1/sandboxes/{sandbox_id}", 204)
        self.sandboxes.remove(sandbox_id)

    def delete_snapshot(self, snapshot_id: str) -> None:
        self.call("DELETE", f"/v1/snapshots/{snapshot_id}", 204)
        self.snapshots.remove(snapshot_id)

    def build_template(self, name: str, memory_mb: int, console: Console, timeout_s: float = 1800.0) -> dict[str, Any]:
        """``base`` with ``memory_mb`` of RAM, built (or found in the cache) and ready."""
        self.call("POST", "/v1/templates", 202, {"name": name, "base": "base", "memory_mb": memory_mb})
        self.templates.append(name)
        deadline = time.monotonic() + timeout_s
        last = ""
        while time.monotonic() < deadline:
            row: dict[str, Any] = self.call("GET", f"/v1/templates/{name}", 200)
            if row["status"] == "ready":
                if row["memory_mb"] != memory_mb:
                    raise BenchError(f"template {name} is ready with {row['memory_mb']} MiB, asked for {memory_mb}")
                return row
            if row["status"] == "error":
                raise BenchError(f"template {name} failed to build: {row.get('error')}")
            progress = str(row.get("progress") or "")
            if progress and progress != last:
                console.print(f"  {name}: {progress}")
                last = progress
            time.sleep(1.0)
        raise BenchError(f"template {name} was not ready within {timeout_s:.0f}s")

    def cleanup(self) -> list[str]:
        """Delete every sandbox, snapshot and template still recorded (404 is fine: a sandbox's delete takes its
        snapshots along). Returns what could not be deleted."""
        failures: list[str] = []

        def delete(path: str) -> None:
            try:
                resp = self.http.delete(path)
                if resp.status_code not in (204, 404):
                    failures.append(f"DELETE {path} -> HTTP {resp.status_code}: {resp.text[:500]}")
            except httpx.HTTPError as err:
                failures.append(f"DELETE {path}: {err!r}")

        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(delete, [f"/v1/sandboxes/{s}" for s in reversed(self.sandboxes)]))
        for snap in self.snapshots:
            delete(f"/v1/snapshots/{snap}")
        for name in self.templates:
            delete(f"/v1/templates/{name}")
        self.sandboxes.clear()
        self.snapshots.clear()
        self.templates.clear()
        return failures

    def close(self) -> None:
        self.http.close()


def ms_since(started: float) -> float:
    return (time.monotonic() - started) * 1000


@contextmanager
def api_session(url: str, api_key: str, console: Console) -> Iterator[Api]:
    """An :class:`Api` that deletes what it created and closes on the way out; a failed cleanup is printed and,
    after a body that succeeded, raised (:class:`BenchError`)."""
    api = Api(url, api_key)
    try:
        yield api
    finally:
        failures = api.cleanup()
        api.close()
        for failure in failures:
            console.print(f"[red]cleanup: {failure}[/]")
    if failures:
        raise BenchError("cleanup failed: " + "; ".join(failures))
