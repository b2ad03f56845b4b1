"""A restart under a steady exec load fails no request: the listening socket belongs to the supervisor (here the
test, doing what systemd's socket activation does), so requests that arrive while the new process starts wait in
its backlog and are answered by the new process, on the same sandboxes (adopted, ``--on-stop keep``)."""

from __future__ import annotations

import signal
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from cryobox.agent.templates.bake import Template
from cryobox.bench.server import ServeProcess
from tests.support.serve import Client
from tests.support.teardown import reclaim_data_dir

SMALL = ["--templates", "base", "--net-pool", "2"]


@dataclass
class Call:
    started: float
    ended: float
    error: str | None


def _load(url: str, key: str, sandbox_id: str, stop: threading.Event, calls: list[Call]) -> None:
    """Exec ``echo`` in a loop, one connection per request (a keep-alive connection the old process closes while
    idle is the client's to reopen; what is tested here is that no *new* connection is refused or dropped)."""
    headers = {"Authorization": f"Bearer {key}", "Connection": "close"}
    n = 0
    while not stop.is_set():
        n += 1
        started = time.monotonic()
        error = None
        try:
            response = httpx.post(
                f"{url}/v1/sandboxes/{sandbox_id}/exec", json={"cmd": f"echo {n}"}, headers=headers, timeout=120
            )
            if response.status_code != 200 or response.json()["stdout"] != f"{n}\n":
                error = f"{response.status_code} {response.text[:200]}"
        except httpx.HTTPError as err:
            error = repr(err)
        calls.append(Call(started, time.monotonic(), error))


def test_a_restart_under_exec_load_fails_no_request(
    tmp_path: Path, cache_dir: Path, templates: dict[str, Template]
) -> None:
    data_dir = tmp_path / "data"
    listener = socket.create_server(("127.0.0.1", 0), backlog=4096)
    serve = ServeProcess(
        data_dir,
        cache_dir=cache_dir,
        prespawn=1,
        extra_args=SMALL,
        extra_env={"CRYOBOX_ON_STOP": "keep"},
        listen_socket=listener,
    )
    stop = threading.Event()
    calls: list[Call] = []
    workers: list[threading.Thread] = []
    try:
        serve.start()
        client = Client(serve.url, serve.api_key)
        sandboxes = [client.create()["id"] for _ in range(2)]
        client.http.close()
        workers = [
            threading.Thread(target=_load, args=(serve.url, serve.api_key, sid, stop, calls), daemon=True)
            for sid in sandboxes
        ]
        for worker in workers:
            worker.start()
        time.sleep(1.5)
        before = len(calls)
        stopping = time.monotonic()
        assert serve.stop(signal.SIGTERM) == 0
        stopped = time.monotonic()
        serve.start()  # the same socket, handed to the new process
        ready = time.monotonic()
        time.sleep(1.5)
        stop.set()
        for worker in workers:
            worker.join(timeout=150)
        failed = [call for call in calls if call.error is not None]
        assert not failed, f"{len(failed)} of {len(calls)} requests failed: {failed[:3]}"
        assert before >= 2 and len(calls) - before >= 2, (before, len(calls))
        # requests sent before the old process had gone were answered after it had: by the new one (they waited in
        # the socket's backlog while no process served)
        waited = [call for call in calls if call.started < stopped < call.ended]
        assert waited, f"no request spanned the {ready - stopped:.1f}s without a server ({len(calls)} in all)"
        print(
            f"\n{len(calls)} execs, none failed; stop took {stopped - stopping:.1f}s, start {ready - stopped:.1f}s; "
            f"the longest wait {max(call.ended - call.started for call in waited):.1f}s"
        )
    finally:
        stop.set()
        for worker in workers:
            worker.join(timeout=150)
        serve.stop(signal.SIGKILL)
        listener.close()
        reclaim_data_dir(data_dir, cache_dir)
