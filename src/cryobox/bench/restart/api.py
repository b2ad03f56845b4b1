"""The HTTP side of ``cryobox bench restart``: a small API client, the background process each sandbox runs (and
the check that the very same process is still alive), and the exec loop a client thread runs during restarts."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Self

import httpx

from ...errors import CryoboxError
from ..hop import checked
from .analysis import Sample

START_BACKGROUND = (
    "setsid nohup sleep 1000000 </dev/null >/dev/null 2>&1 & p=$!; echo $p $(cut -d' ' -f22 /proc/$p/stat)"
)
"""A detached ``sleep`` in its own session; prints its pid and its start time (``/proc/<pid>/stat`` field 22, in
clock ticks since the guest booted), which together name that one process."""


def check_background_cmd(pid: int) -> str:
    return f"cut -d' ' -f22 /proc/{pid}/stat && cat /proc/{pid}/comm"


class Api:
    """``/v1`` calls with one API key; every failure is a :class:`CryoboxError` (transport errors pass through as
    ``httpx.HTTPError``). Use a fresh one after a server restart (its pooled connections died with the server)."""

    def __init__(self, url: str, api_key: str, timeout_s: float = 120.0) -> None:
        headers = {"Authorization": f"Bearer {api_key}"}
        self.client = httpx.Client(base_url=url, headers=headers, timeout=timeout_s, trust_env=False)

    def create(self, template: str, ttl_s: int = 3600) -> dict[str, Any]:
        response = self.client.post("/v1/sandboxes", json={"template": template, "ttl_seconds": ttl_s})
        return checked(response, "create")

    def exec(self, sandbox_id: str, cmd: str, timeout_s: float = 60.0) -> dict[str, Any]:
        body = {"cmd": cmd, "timeout_seconds": timeout_s}
        result = checked(self.client.post(f"/v1/sandboxes/{sandbox_id}/exec", json=body), "exec")
        if result.get("exit_code") != 0:
            raise CryoboxError(f"exec {cmd!r} exited {result.get('exit_code')}: {str(result.get('stderr'))[:300]}")
        return result

    def get(self, sandbox_id: str) -> dict[str, Any]:
        return checked(self.client.get(f"/v1/sandboxes/{sandbox_id}"), "get")

    def statuses(self) -> dict[str, str]:
        """Every listed sandbox's status, by id."""
        items = checked(self.client.get("/v1/sandboxes"), "list").get("items", [])
        return {str(item["id"]): str(item["status"]) for item in items}

    def delete(self, sandbox_id: str) -> None:
        self.client.delete(f"/v1/sandboxes/{sandbox_id}")

    def start_background(self, sandbox_id: str) -> tuple[int, str]:
        """Start the background process (:data:`START_BACKGROUND`); its (pid, start time)."""
        pid, started = self.exec(sandbox_id, START_BACKGROUND)["stdout"].split()
        return int(pid), started

    def background_alive(self, sandbox_id: str, process: tuple[int, str], timeout_s: float = 30.0) -> bool:
        """Whether ``process`` (pid, start time) still runs in the sandbox, answered by an exec."""
        pid, started = process
        try:
            lines = self.exec(sandbox_id, check_background_cmd(pid), timeout_s)["stdout"].split()
        except (CryoboxError, httpx.HTTPError):
            return False
        return bool(lines == [started, "sleep"])

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class ExecLoop(threading.Thread):
    """Execs ``true`` in one sandbox as fast as answers come (short timeouts; after a failure it retries every
    ``retry_s``), recording every attempt as a :class:`Sample`."""

    def __init__(
        self, url: str, api_key: str, sandbox_id: str, *, timeout_s: float = 2.0, retry_s: float = 0.02
    ) -> None:
        super().__init__(name=f"exec-loop-{sandbox_id}", daemon=True)
        self.url, self.api_key, self.sandbox_id = url, api_key, sandbox_id
        self.timeout = httpx.Timeout(timeout_s, connect=min(0.5, timeout_s))
        self.retry_s = retry_s
        self.samples: list[Sample] = []
        self._halt = threading.Event()

    def run(self) -> None:
        headers = {"Authorization": f"Bearer {self.api_key}"}
        body = {"cmd": "true", "timeout_seconds": 5}
        path = f"/v1/sandboxes/{self.sandbox_id}/exec"
        with httpx.Client(base_url=self.url, headers=headers, timeout=self.timeout, trust_env=False) as client:
            while not self._halt.is_set():
                t0 = time.monotonic()
                error = timing = ""
                try:
                    response = client.post(path, json=body)
                    timing = response.headers.get("server-timing", "")
                    if response.status_code != 200:
                        error = f"http {response.status_code}"
                    elif response.json().get("exit_code") != 0:
                        error = "exit code"
                except httpx.HTTPError as err:
                    error = type(err).__name__
                except ValueError:
                    error = "bad body"
                self.samples.append(Sample(t0, time.monotonic(), not error, error, timing))
                if error:
                    self._halt.wait(self.retry_s)

    def between(self, t0: float, t1: float) -> list[Sample]:
        return [s for s in list(self.samples) if s.start >= t0 and s.end <= t1]

    def successes_after(self, t: float) -> int:
        return sum(1 for s in list(self.samples) if s.ok and s.end > t)

    def halt(self) -> None:
        self._halt.set()
        self.join(timeout=10)


def wait_successes(loops: Sequence[ExecLoop], after: float, count: int, timeout_s: float) -> bool:
    """Until every loop has ``count`` successes completed after ``after``; False on timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(loop.successes_after(after) >= count for loop in loops):
            return True
        time.sleep(0.02)
    return False
