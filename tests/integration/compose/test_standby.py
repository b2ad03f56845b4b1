"""A warm standby (``compose/standby.py``) under a steady exec load, with the test as the supervisor (it holds the
listening socket and starts ``cryobox serve`` again after each stop, as systemd's ``Restart=`` does):

- the serving process spawns a standby that registers;
- after a SIGKILL the standby serves the same sandboxes *before* the supervisor starts anything (every request
  sent after the kill is answered), and the supervisor's start stands by for it;
- a SIGTERM (``--on-stop keep``) is a restart the same way, and fails no request at all;
- a start with another configuration (``CRYOBOX_ON_STOP=kill``) takes over at once instead of standing by;
- a takeover that no supervisor claims stops by itself after ``CRYOBOX_STANDBY_GRACE_S``;
- SIGINT stops the server and stands the standby down: nothing of the data dir's serve processes is left.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from cryobox.agent.templates.bake import Template
from cryobox.bench.restart.standbys import REGISTERED, log_size, wait_registered
from cryobox.bench.restart.successor import lock_holder
from tests.integration.compose.test_activation import supervised
from tests.support.execload import Call, start_load
from tests.support.pids import alive
from tests.support.serve import Client
from tests.support.teardown import reclaim_data_dir

GRACE_S = (
    60.0  # a supervisor's start claims the standby long before (its imports run niced: ~10 s under the full suite)
)


def until(what: str, check: Callable[[], bool], timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:.0f} s"
        time.sleep(0.02)


def gone(pid: int) -> bool:
    if not alive(pid):
        return True
    try:  # a zombie (our child, or re-parented) counts as gone
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def kill_and_wait(pid: int, sig: int) -> float:
    """Signal ``pid`` and return when it is gone (reaping it if it is ours)."""
    os.kill(pid, sig)
    until(f"pid {pid} gone after signal {sig}", lambda: gone(pid), 60)
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    return time.monotonic()


def registered_after(log: Path, offset: int, other_than: int) -> int:
    """The first standby registered in ``log`` after ``offset`` that is not ``other_than``."""
    found: list[int] = []

    def seen() -> bool:
        text = log.read_text(errors="replace")[offset:]
        found[:] = [int(pid) for pid in REGISTERED.findall(text) if int(pid) != other_than]
        return bool(found)

    until(f"a standby other than {other_than} registered", seen)
    return found[0]


def reap(launched: list[subprocess.Popen[bytes]]) -> None:
    """After the data dir's processes were killed: each start's exit collected (its ``Popen`` knows it ended)."""
    for proc in launched:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)


def test_a_standby_takes_over_restarts_and_stops_as_the_supervisor_means(
    tmp_path: Path, cache_dir: Path, templates: dict[str, Template]
) -> None:
    data_dir = tmp_path / "data"
    listener, serve = supervised(
        data_dir, cache_dir, 1, {"CRYOBOX_ON_STOP": "keep", "CRYOBOX_STANDBY_GRACE_S": str(GRACE_S)}
    )
    launched: list[subprocess.Popen[bytes]] = []
    clients: list[Client] = []
    stop = threading.Event()
    calls: list[Call] = []
    workers: list[threading.Thread] = []

    def restart() -> int:
        """The supervisor starts the service again; returns the pid of that start."""
        serve.launch()
        assert serve.proc is not None
        launched.append(serve.proc)
        return serve.proc.pid

    try:
        serve.start()
        assert serve.proc is not None
        launched.append(serve.proc)
        first = serve.proc.pid
        spawned = wait_registered(serve.log_path, 0, 120)  # spawned by the server once it served
        assert spawned != first and alive(spawned)
        client = Client(serve.url, serve.api_key)
        clients.append(client)
        sandboxes = [client.create()["id"] for _ in range(2)]
        sleeper = client.sh(sandboxes[0], "setsid sleep 600 >/dev/null 2>&1 < /dev/null & echo $!").strip()
        workers = start_load(serve.url, serve.api_key, sandboxes, stop, calls)
        until("requests answered", lambda: len(calls) >= 4)

        # SIGKILL: the standby serves before the supervisor has started anything
        killed = kill_and_wait(first, signal.SIGKILL)
        until("the standby holds the data dir", lambda: lock_holder(data_dir) == spawned)
        count = len(calls)
        until("requests answered by the standby", lambda: len(calls) >= count + 3, 60)
        after_kill = [c for c in calls if c.started > killed]
        assert after_kill and all(c.error is None for c in after_kill), after_kill[:3]
        offset = log_size(serve.log_path)
        claimer = restart()
        assert wait_registered(serve.log_path, offset, 120) == claimer  # it stands by for the standby that serves
        assert lock_holder(data_dir) == spawned and alive(claimer)

        # SIGTERM with keep: a restart that fails no request
        before = len(calls)
        stopped = kill_and_wait(spawned, signal.SIGTERM)
        until("the claimer holds the data dir", lambda: lock_holder(data_dir) == claimer)
        count = len(calls)
        until("requests answered after the SIGTERM", lambda: len(calls) >= count + 3, 60)
        offset = log_size(serve.log_path)
        second = restart()
        assert wait_registered(serve.log_path, offset, 120) == second
        waited = [c for c in calls if c.started < stopped < c.ended]
        assert all(c.error is None for c in calls[before:]), [c for c in calls[before:] if c.error][:3]
        assert waited or calls[before:], "no request spanned the restart"
        assert client.sh(sandboxes[0], f"kill -0 {sleeper} && echo alive") == "alive\n"  # the same sandboxes

        # another configuration: the supervisor's start takes over at once (an upgrade's hand-over)
        serve.extra_env["CRYOBOX_ON_STOP"] = "kill"
        stopped = kill_and_wait(claimer, signal.SIGTERM)
        until("the second start holds the data dir", lambda: lock_holder(data_dir) == second)
        offset = log_size(serve.log_path)
        changed = restart()
        until("the changed start holds the data dir", lambda: lock_holder(data_dir) == changed, 120)
        until("the second start ended", lambda: gone(second), 60)
        assert "with another configuration or code; taking over" in serve.log_path.read_text()[offset:]
        count = len(calls)
        until("requests answered by the changed start", lambda: len(calls) >= count + 3, 60)
        stop.set()
        for worker in workers:
            worker.join(timeout=150)
        failed = [c for c in calls[before:] if c.error is not None]  # the SIGKILL's request in flight may fail
        assert not failed, f"{len(failed)} of {len(calls) - before} requests since the SIGTERM failed: {failed[:3]}"

        # SIGINT (a stop for good, whatever the mode): the standby is stood down with it
        standby = registered_after(serve.log_path, offset, changed)  # its own, spawned once it served
        kill_and_wait(changed, signal.SIGINT)
        until("the standby stood down", lambda: gone(standby), 30)
        assert "standby: stood down" in serve.log_path.read_text()[offset:]
    finally:
        stop.set()
        for worker in workers:
            worker.join(timeout=150)
        for opened in clients:
            opened.http.close()
        reclaim_data_dir(data_dir, cache_dir)
        reap(launched)
        listener.close()


def test_a_takeover_nobody_claims_stops_after_the_grace(
    tmp_path: Path, cache_dir: Path, templates: dict[str, Template]
) -> None:
    """A SIGTERM that was a stop (no supervisor starts the service again): the standby serves for the grace, then
    stops too, keeping the sandboxes as ``keep`` promises."""
    data_dir = tmp_path / "data"
    listener, serve = supervised(data_dir, cache_dir, 0, {"CRYOBOX_ON_STOP": "keep", "CRYOBOX_STANDBY_GRACE_S": "3"})
    try:
        serve.start()
        assert serve.proc is not None
        spawned = wait_registered(serve.log_path, 0, 120)
        kill_and_wait(serve.proc.pid, signal.SIGTERM)
        until("the standby took over", lambda: lock_holder(data_dir) == spawned)
        took = time.monotonic()
        until("the unclaimed standby stopped", lambda: gone(spawned), 60)
        assert time.monotonic() - took >= 2.0  # it served for its grace first
        assert "nobody restarted the service within 3 s; stopping (keep)" in serve.log_path.read_text()
    finally:
        reclaim_data_dir(data_dir, cache_dir)
        reap([serve.proc] if serve.proc is not None else [])
        listener.close()
