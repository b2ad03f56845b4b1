"""Hostile guests against real VMs: whatever a guest (or a client that stops reading) does, the agent's memory
and the host stay bounded and the other sandboxes keep answering.

Each test measures the serving process's resident memory before and after and asserts a ceiling; the figures
are printed (``-s``) for the closing note of the hostile-guest issue.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx

from cryobox import Sandbox, Snapshots
from cryobox.agent.vm.consolelog import KEEP_BYTES, MAX_BYTES
from cryobox.bench.server import ServeProcess
from tests.support.serve import Api

RSS_CEILING_MIB = 96
"""How much the agent may grow under any one flood (it holds bounded queues, never the flood)."""


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def _vm(server: ServeProcess, sandbox_id: str) -> dict[str, object]:
    record = json.loads((server.data_dir / "vol" / "sandboxes" / f"{sandbox_id}.json").read_text())
    vm: dict[str, object] = record["vm"]
    return vm


def _answers(sbx: Sandbox, within_s: float = 20.0) -> float:
    started = time.monotonic()
    assert sbx.exec("echo alive", timeout_seconds=within_s).stdout == "alive\n"
    return time.monotonic() - started


def test_a_console_flood_is_capped_on_disk(server: ServeProcess, api: Api, sandbox: Sandbox) -> None:
    pid = server.pid
    assert pid is not None
    before = _rss_mib(pid)
    with Sandbox.create(template="base", **api) as noisy:
        run_dir = Path(str(_vm(server, noisy.id)["root"]))
        # 5.5 MiB of random bytes to the serial console (past the 4 MiB cap; the UART takes ~0.4 MB/s under TCG)
        result = noisy.exec("head -c 5767168 /dev/urandom > /dev/ttyS0; echo wrote", timeout_seconds=300)
        assert result.stdout == "wrote\n", result
        time.sleep(2.5)  # the capper runs every second
        sizes = {p.name: p.stat().st_size for p in run_dir.glob("console.log*")}
        print(f"\nconsole flood of 5.5 MiB: log files {sizes}; agent RSS {before:.0f} -> {_rss_mib(pid):.0f} MiB")
        assert "console.log.1" in sizes, sizes  # it was rotated...
        assert sizes["console.log.1"] <= KEEP_BYTES and sizes["console.log"] <= MAX_BYTES, sizes  # ...and is small
        snap = noisy.snapshot()
        with Snapshots(**api) as snapshots:
            evidence = {e["name"]: e["size"] for e in snapshots.evidence(snap.id)}
        assert 0 < evidence["console.log"] <= KEEP_BYTES + MAX_BYTES, evidence
    assert _answers(sandbox) < 20
    assert _rss_mib(pid) - before < RSS_CEILING_MIB


def test_a_client_that_stops_reading_a_stream_holds_back_the_guest_not_the_host(
    server: ServeProcess, api: Api, sandbox: Sandbox
) -> None:
    pid = server.pid
    assert pid is not None
    before = _rss_mib(pid)
    with Sandbox.create(template="base", **api) as producer:
        headers = {"Authorization": f"Bearer {server.api_key}"}
        body = {"cmd": "yes $(head -c 1000 /dev/zero | tr '\\0' x)", "timeout_seconds": 120}
        stop = threading.Event()

        def slow_client() -> None:
            with httpx.stream(
                "POST", f"{server.url}/v1/sandboxes/{producer.id}/exec/stream", json=body, headers=headers, timeout=60
            ) as response:
                assert response.status_code == 200
                stop.wait(30)  # read nothing while `yes` writes as fast as it can

        reader = threading.Thread(target=slow_client, daemon=True)
        reader.start()
        time.sleep(4)
        early = _rss_mib(pid)
        time.sleep(6)  # unbounded buffering grew the agent by 8 MiB/s: 48 MiB in this window
        late = _rss_mib(pid)
        latency = _answers(sandbox)  # another sandbox is not held up
        stop.set()
        reader.join(60)
        print(
            f"\nunread `yes` stream: agent RSS {before:.0f} -> {early:.0f} (4 s) -> {late:.0f} MiB (10 s); "
            f"other exec {latency:.2f}s"
        )
        assert late - early < 8, "the agent keeps buffering what nobody reads"  # flat: the guest is held back
        assert late - before < 48
        assert latency < 10
    assert _answers(sandbox) < 20


def test_a_guest_breaking_the_protocol_gets_its_vm_killed_and_nothing_else(
    server: ServeProcess, api: Api, sandbox: Sandbox
) -> None:
    pid = server.pid
    assert pid is not None
    before = _rss_mib(pid)
    hostile = Sandbox.create(template="base", **api)
    try:
        qemu = int(str(_vm(server, hostile.id)["pid"]))
        # root in the guest: shadow the guest agent with its own module (init restarts `python3 -m cryobox_guest`
        # from /root), kill the real one, and announce a 120 MiB frame of garbage on the port
        rogue = (
            "import glob, os, struct, time\n"
            "ports = glob.glob('/sys/class/virtio-ports/*/name')\n"
            "dev = next(p.split('/')[-2] for p in ports if open(p).read().strip() == 'cryobox.agent')\n"
            "fd = os.open('/dev/' + dev, os.O_RDWR)\n"
            "os.write(fd, struct.pack('>I', 120 << 20))\n"
            "[os.write(fd, b'x' * 65536) for _ in range(64)]\n"
            "time.sleep(3600)\n"
        )
        hostile.exec("mkdir -p /root/cryobox_guest && touch /root/cryobox_guest/__init__.py")
        hostile.filesystem.write("/root/cryobox_guest/__main__.py", rogue)
        attack = "nohup sh -c 'sleep 1; pkill -9 -f \"python3 -m cryobox_guest\"' >/dev/null 2>&1 &"
        hostile.exec(attack, timeout_seconds=30)
        deadline = time.monotonic() + 30
        while Path(f"/proc/{qemu}").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        gone = not Path(f"/proc/{qemu}").exists() or "Z" in Path(f"/proc/{qemu}/stat").read_text().split()[2]
        print(f"\nguest protocol violation: QEMU killed {gone}; agent RSS {before:.0f} -> {_rss_mib(pid):.0f} MiB")
        assert gone, "the VM of a guest that broke the protocol is still running"
    finally:
        hostile.kill()
    assert _answers(sandbox) < 20
    assert _rss_mib(pid) - before < RSS_CEILING_MIB


def test_fork_bomb_and_memory_hog_stay_inside_their_vm(server: ServeProcess, api: Api, sandbox: Sandbox) -> None:
    pid = server.pid
    assert pid is not None
    before = _rss_mib(pid)
    with Sandbox.create(template="base", **api) as bomb, Sandbox.create(template="base", **api) as hog:
        bomb.exec("nohup sh -c ':(){ :|:& };:' >/dev/null 2>&1 &", timeout_seconds=30)
        hog.exec(
            "nohup python3 -c 'b = []\nwhile True: b.append(bytearray(64 << 20))' >/dev/null 2>&1 &",
            timeout_seconds=30,
        )
        time.sleep(8)
        latency = _answers(sandbox, within_s=60)
        for victim in (bomb, hog):
            qemu = int(str(_vm(server, victim.id)["pid"]))
            rss = _rss_mib(qemu)
            limit_mib = (512 + 384) if "tcg" in Path(f"/proc/{qemu}/cmdline").read_text() else (512 + 192)
            print(f"\n{victim.id}: QEMU RSS {rss:.0f} MiB (cgroup limit {limit_mib} MiB)")
            assert rss <= limit_mib
        print(f"other sandbox exec during fork bomb + memory hog: {latency:.2f}s")
        assert latency < 30
    assert _rss_mib(pid) - before < RSS_CEILING_MIB
