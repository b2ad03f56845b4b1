"""SIGKILL the agent at every step of create, snapshot, fork_tree, hibernate, wake and delete (two rounds each),
restart it, and check that nothing was lost or leaked:

* every sandbox that was running before the kill is listed ``running`` and answers exec with its process and
  memory intact (and paused and hibernated ones keep their state);
* the operation that was cut short left either nothing or a complete result (a sandbox that answers, a snapshot
  that restores with its bytes), never a row without a VM or a VM without a row;
* no QEMU, run directory, record or hibernation image is left over (``Chaos.settle``).

One ``cryobox serve`` process serves every round: the crash step is armed at run time through a file.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cryobox.agent.crashpoints import STEPS
from cryobox.agent.templates.bake import Template
from tests.support.chaos import Chaos

ROUNDS = (1, 2)


@pytest.fixture(scope="module")
def chaos(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path, templates: dict[str, Template]) -> Iterator[Chaos]:
    root = tmp_path_factory.mktemp("chaos")
    harness = Chaos(root / "data", cache_dir)
    try:
        harness.start()
        running = harness.new_sandbox()
        paused = harness.new_sandbox()
        hibernated = harness.new_sandbox()
        harness.api.call("POST", f"/v1/sandboxes/{paused}/pause", 204)
        harness.api.call("POST", f"/v1/sandboxes/{hibernated}/hibernate")
        snap = harness.api.snapshot(running, retain=True)
        harness.snapshots[snap["id"]] = harness.marks[running]
        yield harness
        # the witnesses come through every crash with their state: wake the paused and hibernated ones now
        harness.api.call("POST", f"/v1/sandboxes/{paused}/resume", 204)
        for sandbox_id in (running, paused, hibernated):
            harness.expect_mark(sandbox_id)
        assert harness.rounds == len(STEPS) * len(ROUNDS)
        p50 = sorted(harness.restarts)[len(harness.restarts) // 2]
        print(f"chaos: {harness.rounds} crash rounds, restarts {p50:.1f} s p50")
    finally:
        harness.stop()


def _witness(chaos: Chaos, status: str) -> str:
    states = chaos.states()
    return next(i for i in chaos.marks if states.get(i) == status)


@pytest.mark.parametrize("round_", ROUNDS)
@pytest.mark.parametrize("step", [s for s in STEPS if s.startswith("create.")])
def test_crash_in_create(chaos: Chaos, step: str, round_: int) -> None:
    before = chaos.states()
    chaos.crash_during(step, "POST", "/v1/sandboxes", json={"template": "base"})
    assert chaos.states() == before, "a create cut short leaves no sandbox (the control plane never answered)"
    chaos.check(before)
    fresh = chaos.new_sandbox()  # and creating works again
    chaos.expect_mark(fresh)
    chaos.api.call("DELETE", f"/v1/sandboxes/{fresh}", 204)
    chaos.marks.pop(fresh)


@pytest.mark.parametrize("round_", ROUNDS)
@pytest.mark.parametrize("step", [s for s in STEPS if s.startswith(("snapshot.", "fork_tree."))])
def test_crash_in_snapshot_and_fork_tree(chaos: Chaos, step: str, round_: int) -> None:
    parent = _witness(chaos, "running")
    before, snapshots = chaos.states(), chaos.snapshot_ids()
    if step.startswith("snapshot."):
        chaos.crash_during(step, "POST", f"/v1/sandboxes/{parent}/snapshots", json={})
    else:
        chaos.crash_during(step, "POST", f"/v1/sandboxes/{parent}/fork-tree", json={"count": 2})
    assert chaos.snapshot_ids() == snapshots, "no snapshot row without an answer"
    chaos.check(before)  # no child of the cut-short tree runs on
    for snapshot_id in snapshots:
        chaos.restores(snapshot_id)  # every listed snapshot restores with its bytes


@pytest.mark.parametrize("round_", ROUNDS)
@pytest.mark.parametrize("step", [s for s in STEPS if s.startswith(("hibernate.", "wake.", "delete."))])
def test_crash_in_lifecycle(chaos: Chaos, step: str, round_: int) -> None:
    target = chaos.new_sandbox()
    if step.startswith("wake."):
        chaos.api.call("POST", f"/v1/sandboxes/{target}/hibernate")
    before = chaos.states()
    action = step.split(".")[0]
    if action == "delete":
        chaos.crash_during(step, "DELETE", f"/v1/sandboxes/{target}")
    else:
        chaos.crash_during(step, "POST", f"/v1/sandboxes/{target}/{action}")
    after = chaos.states()
    if action == "delete":
        assert target not in after
        chaos.marks.pop(target)
    else:
        # cut short before its record changed: as it was; after: hibernated (the image is complete)
        expected = {"hibernate.captured": "running"}.get(step, "hibernated")
        assert after[target] == expected, f"{step}: {after[target]}"
    chaos.check(before, changed={target})
    if action != "delete":
        chaos.expect_mark(target)  # wakes it if hibernated: same process, same memory
        chaos.api.call("DELETE", f"/v1/sandboxes/{target}", 204)
        chaos.marks.pop(target)
