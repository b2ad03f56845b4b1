"""An upgrade (``SIGUSR2``) under a steady exec load fails no request: the running ``serve`` starts its successor
with the listening socket, keeps serving while the successor imports, then stops keeping its sandboxes (though
started with ``--on-stop kill``); the successor adopts them and answers on the same socket. Told over a stand-in
for systemd's notification socket: ``READY=1`` from the first process once it serves, ``MAINPID=<successor>`` from
it at the hand-over (no ``STOPPING=1``: the service goes on), ``READY=1`` from the successor."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from pathlib import Path

import httpx

from cryobox.agent.templates.bake import Template
from cryobox.bench.restart.successor import wait_successor
from cryobox.bench.server import ServeProcess
from tests.integration.compose.test_activation import SMALL
from tests.support.execload import Call, end_load, start_load
from tests.support.pids import alive
from tests.support.sdnotify import notify_socket
from tests.support.serve import Client
from tests.support.teardown import reclaim_data_dir


def test_an_upgrade_under_exec_load_fails_no_request_and_keeps_the_sandboxes(
    tmp_path: Path, cache_dir: Path, templates: dict[str, Template]
) -> None:
    data_dir = tmp_path / "data"
    systemd = contextlib.ExitStack()
    notes = systemd.enter_context(notify_socket(tmp_path / "notify"))
    serve = ServeProcess(
        data_dir, cache_dir=cache_dir, prespawn=1, extra_args=SMALL, extra_env={"NOTIFY_SOCKET": str(notes.path)}
    )  # --on-stop kill
    stop = threading.Event()
    calls: list[Call] = []
    workers: list[threading.Thread] = []
    successor: int | None = None
    try:
        serve.start()
        assert serve.proc is not None
        old = serve.proc.pid
        notes.wait_for("READY=1", old)
        client = Client(serve.url, serve.api_key)
        sandboxes = [client.create()["id"] for _ in range(2)]
        sleeper = client.sh(sandboxes[0], "setsid sleep 600 >/dev/null 2>&1 < /dev/null & echo $!").strip()
        client.http.close()
        workers = start_load(serve.url, serve.api_key, sandboxes, stop, calls)
        time.sleep(1.5)
        before = len(calls)
        asked = time.monotonic()
        os.kill(old, signal.SIGUSR2)
        assert serve.proc.wait(timeout=180) == 0  # the old process handed over and exited cleanly
        exited = time.monotonic()
        deadline = exited + 120
        successor = wait_successor(data_dir, old, timeout_s=120)
        assert alive(successor), successor
        notes.wait_for(f"MAINPID={successor}", old)  # systemd follows the successor
        notes.wait_for("READY=1", successor)
        assert (old, "STOPPING=1") not in notes.messages
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{serve.url}/healthz", timeout=2).status_code == 200:
                    break
            time.sleep(0.05)
        serving = time.monotonic()
        time.sleep(1.5)
        end_load(stop, workers, calls, before)
        spanning = [call for call in calls if call.started < exited < call.ended]
        longest = max(call.ended - call.started for call in calls)
        client = Client(serve.url, serve.api_key)
        listed = {s["id"]: s["status"] for s in client.call("GET", "/v1/sandboxes")["items"]}
        assert {sid: listed.get(sid) for sid in sandboxes} == {sid: "running" for sid in sandboxes}
        assert client.sh(sandboxes[0], f"kill -0 {sleeper} && echo alive") == "alive\n"  # the same VM, adopted
        client.http.close()
        print(
            f"\nupgrade: {len(calls)} execs, none failed; {exited - asked:.1f}s from SIGUSR2 to the old process's "
            f"exit, serving {serving - exited:.1f}s later; {len(spanning)} spanned the exit; longest exec "
            f"{longest:.2f}s"
        )
    finally:
        stop.set()
        for worker in workers:
            worker.join(timeout=150)
        if successor is not None and alive(successor):
            os.kill(successor, signal.SIGTERM)  # --on-stop kill (inherited): its VMs go with it
            deadline = time.monotonic() + 60
            while alive(successor) and time.monotonic() < deadline:
                time.sleep(0.1)
            if alive(successor):
                os.kill(successor, signal.SIGKILL)
        serve.stop(signal.SIGKILL)
        reclaim_data_dir(data_dir, cache_dir)
        systemd.close()
