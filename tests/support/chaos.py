"""One ``cryobox serve`` on one data dir for the whole crash suite, armed to SIGKILL itself at a named step
(``CRYOBOX_CRASH_FILE``), restarted after every crash, and the checks every round ends with."""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from cryobox.agent.host.reclaim import find_own_qemus
from cryobox.bench.server import ServeProcess
from tests.support.serve import Client
from tests.support.teardown import reclaim_data_dir

ARGS = ["--templates", "base", "--net-pool", "2"]
MARK = "cat /run/mark; kill -0 $(cat /root/pid) && echo alive"
"""What every sandbox carries: a file in guest RAM (tmpfs /run) and a background process; both must survive."""


@dataclass
class Chaos:
    data_dir: Path
    cache_dir: Path
    proc: ServeProcess | None = None
    client: Client | None = None
    marks: dict[str, str] = field(default_factory=dict)
    """Sandbox id → its mark (every sandbox the suite made that should exist)."""
    snapshots: dict[str, str] = field(default_factory=dict)
    """Snapshot id → the mark of the sandbox it was taken of."""
    rounds: int = 0
    restarts: list[float] = field(default_factory=list)

    @property
    def arm_file(self) -> Path:
        return self.data_dir.parent / "crash.arm"

    @property
    def run_dir(self) -> Path:
        return self.data_dir / "vol" / "run"

    @property
    def api(self) -> Client:
        assert self.client is not None
        return self.client

    def start(self) -> None:
        began = time.monotonic()
        env = {"CRYOBOX_ON_STOP": "kill", "CRYOBOX_CRASH_FILE": str(self.arm_file)}
        self.proc = ServeProcess(self.data_dir, cache_dir=self.cache_dir, prespawn=0, extra_args=ARGS, extra_env=env)
        self.proc.start()
        self.client = Client(self.proc.url, self.proc.api_key, timeout=120)
        self.restarts.append(time.monotonic() - began)

    def stop(self) -> None:
        self.arm_file.unlink(missing_ok=True)
        if self.client is not None:
            self.client.http.close()
        if self.proc is not None:
            self.proc.stop(signal.SIGTERM)
        reclaim_data_dir(self.data_dir, self.cache_dir)

    # -- sandboxes with marks ------------------------------------------------------------------------------

    def new_sandbox(self, **body: Any) -> str:
        sandbox_id: str = self.api.call("POST", "/v1/sandboxes", 201, json={"template": "base", **body})["id"]
        self.mark(sandbox_id, sandbox_id)
        return sandbox_id

    def mark(self, sandbox_id: str, mark: str) -> None:
        self.api.sh(sandbox_id, f"echo {mark} > /run/mark; (sleep 100000 &) ; pgrep -n sleep > /root/pid")
        self.marks[sandbox_id] = mark

    def expect_mark(self, sandbox_id: str) -> None:
        assert self.api.sh(sandbox_id, MARK) == f"{self.marks[sandbox_id]}\nalive\n", sandbox_id

    def states(self) -> dict[str, str]:
        return {s["id"]: s["status"] for s in self.api.call("GET", "/v1/sandboxes")["items"]}

    def snapshot_ids(self) -> set[str]:
        return {s["id"] for s in self.api.call("GET", "/v1/snapshots")["snapshots"]}

    # -- one crash -----------------------------------------------------------------------------------------

    def crash_during(self, step: str, method: str, path: str, **kwargs: Any) -> None:
        """Arm ``step``, send the request that reaches it, and see the server die of SIGKILL; then restart."""
        assert self.proc is not None
        self.arm_file.write_text(step)
        try:
            response = self.api.http.request(method, path, **kwargs)
        except httpx.TransportError:
            pass
        else:
            raise AssertionError(f"{step}: the request finished ({response.status_code}) instead of crashing")
        finally:
            self.arm_file.unlink(missing_ok=True)
        assert self.proc.proc is not None
        assert self.proc.proc.wait(timeout=30) == -signal.SIGKILL, f"{step}: the server did not die of SIGKILL"
        self.api.http.close()
        self.rounds += 1
        self.start()

    # -- the checks every round ends with ------------------------------------------------------------------

    def settle(self) -> None:
        """Every QEMU is a running sandbox's (a crashed create, wake or delete left none behind), every run dir a
        QEMU's, every hibernation image and record a sandbox's."""
        deadline = time.monotonic() + 30
        while True:  # a stray's deletion kills its QEMU first and removes its run dir after (QMP's close: up to 2 s)
            states = self.states()
            live = sum(1 for s in states.values() if s in ("running", "paused"))
            qemus = len(find_own_qemus(self.run_dir))
            vm_dirs = [p for p in self.run_dir.iterdir() if p.name.startswith("vm-")]
            if (qemus == live and len(vm_dirs) == live) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert qemus == live, f"{qemus} QEMUs for {live} running/paused sandboxes: {states}"
        assert len(vm_dirs) == live, f"run dirs {sorted(p.name for p in vm_dirs)} for {live} VMs"
        records = {p.stem for p in (self.data_dir / "vol" / "sandboxes").glob("*.json")}
        assert records == set(states), f"records {sorted(records)} != sandboxes {sorted(states)}"
        images = {p.name.split(".h")[0] for p in (self.data_dir / "vol" / "hibernate").iterdir()}
        assert images == {i for i, s in states.items() if s == "hibernated"}, f"hibernation images {images}"
        assert not [s for s in states.values() if s not in ("running", "paused", "hibernated")], states

    def check(self, before: dict[str, str], *, changed: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        """Sandboxes the crashed operation did not touch have the state they had, and answer with their memory."""
        after = self.states()
        for sandbox_id, status in before.items():
            if sandbox_id in changed:
                continue
            assert after.get(sandbox_id) == status, f"{sandbox_id} was {status}, now {after.get(sandbox_id)}"
            if status == "running":
                self.expect_mark(sandbox_id)
        self.settle()

    def restores(self, snapshot_id: str) -> None:
        child = self.api.call("POST", "/v1/sandboxes", 201, json={"template": "base", "from_snapshot": snapshot_id})
        try:
            assert self.api.sh(child["id"], "cat /run/mark") == f"{self.snapshots[snapshot_id]}\n"
        finally:
            self.api.call("DELETE", f"/v1/sandboxes/{child['id']}", 204)
