"""Every sandbox's QEMU is jailed: its own uid without capabilities, seccomp, its own mount/PID/IPC namespaces
holding only its own files, an empty environment, a cgroup with limits, a tap only its uid may open."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import httpx

from cryobox import Sandbox
from cryobox.agent.net.slots import tag_for
from cryobox.agent.vm import detect_accel, qemu
from cryobox.agent.vm.jail import OVERHEAD_MIB, QEMU_THREADS_CPUS, JailSettings
from cryobox.bench.server import ServeProcess
from tests.support.serve import Api


def _status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.strip() for k, _, v in (line.partition(":") for line in lines)}


def _vm_record(server: ServeProcess, sandbox_id: str) -> dict[str, Any]:
    record: dict[str, Any] = json.loads((server.data_dir / "vol" / "sandboxes" / f"{sandbox_id}.json").read_text())
    vm: dict[str, Any] = record["vm"]
    return vm


def _visible(pid: int) -> set[str]:
    """Every path the process can see under its root (its whole filesystem, walked from the host)."""
    root = Path(f"/proc/{pid}/root")
    seen: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(root):
        rel = "/" + str(Path(dirpath).relative_to(root)).lstrip(".")
        if rel.startswith("/usr/"):  # the distribution's files (read-only), not walked further
            dirnames.clear()
            continue
        seen.update(str(Path(rel) / n) for n in dirnames + filenames)
    return seen


def test_each_qemu_runs_jailed_and_sees_only_its_own_files(server: ServeProcess, api: Api) -> None:
    one = Sandbox.create(template="base", **api)
    two = Sandbox.create(template="base", **api)
    try:
        vm1, vm2 = _vm_record(server, one.id), _vm_record(server, two.id)
        pid = int(vm1["pid"])
        status = _status(pid)

        uid = int(status["Uid"].split()[0])
        assert uid >= 1000 and status["Uid"].split() == [str(uid)] * 4, status["Uid"]
        assert status["Gid"].split() == [str(uid)] * 4
        # no supplementary group but, under QEMU < 8.2 (which opens every RAM file read-write), the image group
        settings = JailSettings.for_tag(tag_for(server.data_dir))
        assert settings is not None and uid in settings.uid_range
        image_group = [] if qemu.private_readonly() else [str(settings.image_gid)]
        assert status["Groups"].split() == image_group
        assert vm1["uid"] == uid and vm2["uid"] != uid  # one uid per VM
        assert int(status["CapEff"], 16) == 0 and int(status["CapPrm"], 16) == 0 and int(status["CapBnd"], 16) == 0
        assert status["NoNewPrivs"] == "1" and status["Seccomp"] == "2"
        assert status["NSpid"].split()[1:] == ["1"]  # PID 1 of a PID namespace of its own
        for ns in ("mnt", "pid", "ipc", "net"):
            assert os.readlink(f"/proc/{pid}/ns/{ns}") != os.readlink(f"/proc/self/ns/{ns}"), ns
        assert Path(f"/proc/{pid}/environ").read_bytes() == b""  # no AWS_*, CRYOBOX_*, database URL

        seen = _visible(pid)
        assert vm1["root"] + "/qmp.sock" in seen and vm1["memory_path"] in seen
        assert not any(p.startswith(vm2["root"]) for p in seen), "another VM's run dir is visible"
        assert not any(p.startswith(str(server.data_dir / "registry")) for p in seen)
        assert "/etc/passwd" not in seen and "/root" not in seen and "/proc/1" not in seen
        assert {"/dev/null", "/dev/urandom", "/dev/net/tun", "/dev/userfaultfd"} <= seen
        tun = os.stat(f"/proc/{pid}/root/dev/net/tun")
        assert tun.st_uid == uid and tun.st_mode & 0o777 == 0o600
        # the kernel, the base image and the template disk are there, read-only
        mounts = Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
        backing = [m for m in mounts if "disk.qcow2" in m.split()[4] and "/templates/" in m.split()[4]]
        assert backing and all(" ro," in f" {m.split()[5]}," or m.split()[5].startswith("ro") for m in backing)

        cgroups = Path(f"/proc/{pid}/cgroup").read_text()
        tag = tag_for(server.data_dir)
        for controller in ("memory", "cpu", "pids"):
            line = next(x for x in cgroups.splitlines() if f":{controller}:" in x or f",{controller}:" in x)
            assert line.endswith(f"/cryobox-{tag}/{vm1['vm_id']}"), line
        memory_dir = next(Path("/sys/fs/cgroup/memory").glob(f"**/cryobox-{tag}/{vm1['vm_id']}"))
        limit = int((memory_dir / "memory.limit_in_bytes").read_text())
        assert limit == (512 + OVERHEAD_MIB[detect_accel()]) << 20
        cpu_dir = next(Path("/sys/fs/cgroup/cpu").glob(f"**/cryobox-{tag}/{vm1['vm_id']}"))
        period = int((cpu_dir / "cpu.cfs_period_us").read_text())
        assert int((cpu_dir / "cpu.cfs_quota_us").read_text()) == int((1 + QEMU_THREADS_CPUS) * period)  # 1 vCPU
        pids_dir = next(Path("/sys/fs/cgroup/pids").glob(f"**/cryobox-{tag}/{vm1['vm_id']}"))
        assert (pids_dir / "pids.max").read_text().strip() == "256"

        owner = subprocess.run(
            ["ip", "netns", "exec", vm1["netns"], "cat", "/sys/class/net/tap0/owner"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert owner == str(uid)

        # the jailed VM works: exec, snapshot (a background snapshot needs its userfaultfd), restore
        assert one.exec("echo jailed").stdout == "jailed\n"
        snap = one.snapshot()
        with Sandbox.create(from_snapshot=snap.id, **api) as child:
            assert child.exec("echo child").stdout == "child\n"
        memory_dir_gone = vm1["vm_id"]
    finally:
        one.kill()
        two.kill()
    assert not list(Path("/sys/fs/cgroup/memory").glob(f"**/cryobox-{tag}/{memory_dir_gone}"))  # removed with it


def test_info_states_the_isolation_boundary(server: ServeProcess) -> None:
    body = httpx.get(f"{server.url}/v1/info", headers={"Authorization": f"Bearer {server.api_key}"}).json()
    (host,) = body["isolation"].values()
    assert host["enabled"] is True and host["seccomp"] is True and host["cgroup"] == "v1"
    assert set(host["namespaces"]) >= {"mount", "pid", "ipc", "net"}
    if body["accelerator"] == "tcg":
        assert "not a security boundary" in host["boundary"]
        assert any("unprivileged_userfaultfd" in item for item in host["host_weakened"])
