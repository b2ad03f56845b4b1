"""A restart under a steady exec load fails no request: the listening socket belongs to the supervisor (here the
test, doing what systemd's socket activation does), so requests that arrive while the new process starts wait in
its backlog and are answered by the new process, on the same sandboxes (adopted, ``--on-stop keep``)."""

from __future__ import annotations

import signal
import socket
import threading
import time
from pathlib import Path

from cryobox.agent.templates.bake import Template
from cryobox.bench.server import ServeProcess
from tests.support.execload import Call, end_load, start_load
from tests.support.serve import Client
from tests.support.teardown import reclaim_data_dir

SMALL = ["--templates", "base", "--net-pool", "2"]


def supervised(
    data_dir: Path, cache_dir: Path, prespawn: int, env: dict[str, str]
) -> tuple[socket.socket, ServeProcess]:
    """A small ``serve`` whose supervisor is the test: it holds the listening socket, as systemd's ``.socket``."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=4096)
    serve = ServeProcess(
        data_dir, cache_dir=cache_dir, prespawn=prespawn, extra_args=SMALL, extra_env=env, listen_socket=listener
    )
    return listener, serve


def test_a_restart_under_exec_load_fails_no_request(
    tmp_path: Path, cache_dir: Path, templates: dict[str, Template]
) -> None:
    data_dir = tmp_path / "data"
    # the plain restart (test_standby.py: with a standby)
    listener, serve = supervised(data_dir, cache_dir, 1, {"CRYOBOX_ON_STOP": "keep", "CRYOBOX_STANDBY": "0"})
    stop = threading.Event()
    calls: list[Call] = []
    workers: list[threading.Thread] = []
    try:
        serve.start()
        client = Client(serve.url, serve.api_key)
        sandboxes = [client.create()["id"] for _ in range(2)]
        client.http.close()
        workers = start_load(serve.url, serve.api_key, sandboxes, stop, calls)
        time.sleep(1.5)
        before = len(calls)
        stopping = time.monotonic()
        assert serve.stop(signal.SIGTERM) == 0
        stopped = time.monotonic()
        serve.start()  # the same socket, handed to the new process
        ready = time.monotonic()
        time.sleep(1.5)
        end_load(stop, workers, calls, before)
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
