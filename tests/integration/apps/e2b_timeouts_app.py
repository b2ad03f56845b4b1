"""Timeout actions through E2B's Python SDK (``e2b``, pinned), run unchanged against ``cryobox serve``: what agent
frameworks ask for by default now, ``lifecycle={"on_timeout": "pause", "auto_resume": ...}``.

Three sandboxes with a 5 s timeout: one pauses at it (its file and background process are there after
``connect``), one is killed by it, one pauses and resumes on a plain ``commands.run``. A paused sandbox refuses
commands until it is resumed when it did not ask for auto-resume, and forks while paused (staying paused). One JSON
report, a step per entry (``e2b_app.step``); run as a module from the repository's root
(``tests.support.e2b.run_app_module``).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any

from e2b import Sandbox, SandboxState

from tests.integration.apps.e2b_app import REPORT, step

WAIT_S = 180.0
TIMEOUT_S = 5


def wait_for(what: str, done: Callable[[], bool]) -> float:
    """Seconds until ``done()``; raises after :data:`WAIT_S`."""
    started = time.monotonic()
    while not done():
        if time.monotonic() - started > WAIT_S:
            raise TimeoutError(f"{what}: not after {WAIT_S:.0f} s")
        time.sleep(0.5)
    return round(time.monotonic() - started, 1)


def state(sandbox_id: str) -> str:
    try:
        return str(Sandbox.get_info(sandbox_id).state.value)
    except Exception as err:  # the SDK's not-found: the sandbox is gone
        return f"gone: {type(err).__name__}"


def is_paused(sandbox_id: str) -> bool:
    return bool(state(sandbox_id) == SandboxState.PAUSED.value)


def refused(fn: Callable[[], Any]) -> dict[str, Any]:
    try:
        fn()
    except Exception as err:
        return {"refused": True, "message": f"{type(err).__name__}: {err}"[:300]}
    return {"refused": False}


def main() -> int:
    made: list[Sandbox] = []
    try:
        paused = Sandbox.create(timeout=TIMEOUT_S, lifecycle={"on_timeout": "pause"})
        killed = Sandbox.create(timeout=TIMEOUT_S)
        auto = Sandbox.create(timeout=TIMEOUT_S, lifecycle={"on_timeout": "pause", "auto_resume": True})
        made += [paused, killed, auto]
        REPORT["ids"] = {"paused": paused.sandbox_id, "killed": killed.sandbox_id, "auto": auto.sandbox_id}
        step(
            "setup",
            lambda: paused.commands.run(
                "echo kept > /tmp/kept; nohup sleep 900 >/dev/null 2>&1 & echo $! > /tmp/pid; cat /tmp/pid"
            ).stdout.strip(),
        )
        step("setup_auto", lambda: auto.commands.run("echo auto > /tmp/auto").stdout)

        def lifecycle_info() -> dict[str, Any]:
            info = Sandbox.get_info(paused.sandbox_id)
            return dict(info.lifecycle or {})

        step("lifecycle_info", lifecycle_info)
        step("paused_after", lambda: wait_for("pause", lambda: is_paused(paused.sandbox_id)))
        step("killed_after", lambda: wait_for("kill", lambda: state(killed.sandbox_id).startswith("gone")))
        step("killed_state", lambda: state(killed.sandbox_id))
        step("no_auto_resume", lambda: refused(lambda: paused.commands.run("echo should-not-run")))
        step("still_paused", lambda: state(paused.sandbox_id))

        def connect() -> dict[str, Any]:
            started = time.monotonic()
            back = Sandbox.connect(paused.sandbox_id, timeout=600)
            out = back.commands.run("cat /tmp/kept; kill -0 $(cat /tmp/pid) && echo alive").stdout
            return {"out": out, "ms": round((time.monotonic() - started) * 1000), "state": state(paused.sandbox_id)}

        step("connect", connect)
        step("auto_paused_after", lambda: wait_for("pause", lambda: is_paused(auto.sandbox_id)))

        def auto_resume() -> dict[str, Any]:
            out = auto.commands.run("cat /tmp/auto").stdout  # a plain request by id: no connect
            return {"out": out, "state": state(auto.sandbox_id)}

        step("auto_resume", auto_resume)

        def fork_paused() -> dict[str, Any]:
            paused.pause()
            before = state(paused.sandbox_id)
            [child] = paused.fork(timeout=120)
            if isinstance(child, Exception):
                raise child
            made.append(child)
            out = child.commands.run("cat /tmp/kept").stdout
            return {"before": before, "child": out, "parent_after": state(paused.sandbox_id)}

        step("fork_paused", fork_paused)
    finally:
        for sandbox in made:
            try:
                sandbox.kill()
            except Exception:  # gone already (the killed one)
                pass
        print(json.dumps(REPORT, default=repr))
    return 0


if __name__ == "__main__":
    sys.exit(main())
