"""Any image boots: a root filesystem holding only a static busybox (no Python, no libc) and
``/etc/cryobox/defaults.json``, baked with the agent disk, serves execs with the image's defaults, files, a
snapshot and its restore, a fork, and a hibernation and its wake."""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from cryobox.agent.host.reclaim import find_own_qemus
from cryobox.agent.host.startup import HostConfig, machine_for
from cryobox.agent.net.bakenet import bake_network
from cryobox.agent.sandbox.admission import AdmissionConfig
from cryobox.agent.templates.bake import TemplateBaker
from cryobox.agent.vm import detect_accel, host_tsc_khz
from cryobox.agentapi import models as am
from cryobox.compose.parts import AgentOptions, boot_agent
from cryobox.config import Paths
from cryobox.image.agentdisk import build_agent_disk
from cryobox.image.builder import ImageSet
from cryobox.image.cache import ContentCache
from cryobox.image.initramfs import BUSYBOX, build_initramfs
from cryobox.image.kernel import build_kernel
from cryobox.image.rootfs import Rootfs
from cryobox.image.specs import TemplateSpec

DEFAULTS = {"env": {"GREETING": "hello from the image"}, "workdir": "/srv/app", "user": "app"}


def new(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(5)}"


def busybox_rootfs(out: Path) -> Rootfs:
    """``out/rootfs.ext4``: /bin/busybox and its applet links, a minimal /etc, the exec defaults; nothing else."""
    root = out / "tree"
    for d in ("bin", "dev", "proc", "sys", "tmp", "run", "root", "etc/cryobox", "srv/app", "home/app"):
        (root / d).mkdir(parents=True, exist_ok=True)
    shutil.copy2(BUSYBOX, root / "bin" / "busybox")
    subprocess.run([str(root / "bin" / "busybox"), "--install", "-s", str(root / "bin")], check=True)
    for link in (root / "bin").iterdir():  # --install writes absolute links to where it ran: the image's own
        if link.is_symlink():
            link.unlink()
            link.symlink_to("busybox")
    (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/home/app:/bin/sh\n")
    (root / "etc" / "group").write_text("root:x:0:\napp:x:1000:\n")
    (root / "etc" / "cryobox" / "defaults.json").write_text(json.dumps(DEFAULTS))
    for d in ("srv/app", "home/app"):
        shutil.chown(root / d, 1000, 1000)
    assert not list(root.glob("usr/lib/python3*")) and not list(root.rglob("libc.so*")), "the image must be bare"
    (out / "rootfs.ext4").unlink(missing_ok=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-L", "cryoroot", "-d", str(root), str(out / "rootfs.ext4"), "64M"])
    (out / "rootfs.ext4").chmod(0o444)
    return Rootfs(out)


async def run(agent: object, sandbox_id: str, cmd: str) -> str:
    result = await agent.exec(sandbox_id, am.ExecRequest(cmd=cmd, timeout_s=60))  # type: ignore[attr-defined]
    assert result.exit_code == 0, (cmd, result)
    return str(result.stdout)


@pytest.mark.timeout(1200)
async def test_a_busybox_only_image_boots_from_the_agent_disk(
    tmp_path_factory: pytest.TempPathFactory, cache_dir: Path
) -> None:
    data_dir = tmp_path_factory.mktemp("agentdisk")
    images_dir = cache_dir / "images"
    cache = ContentCache(images_dir)
    kernel = build_kernel(cache, print)
    rootfs = busybox_rootfs(data_dir / "image")
    images = ImageSet(kernel, build_initramfs(cache, kernel, print), rootfs, build_agent_disk(cache, print))
    spec = TemplateSpec(name=new("bare"), packages=(), agent_disk=True, warmup=("true",))
    config = HostConfig(paths=Paths(data_dir / "host", cache_dir), prespawn=0, net_pool=4, templates=())
    host, agent = await boot_agent(
        config, AdmissionConfig(max_concurrent=2, queue_length=8, timeout_s=300), AgentOptions(name="ad"), print
    )
    try:
        machine = machine_for(spec, images, detect_accel(), host_tsc_khz())
        assert images.agent_disk is not None and machine.agent_disk == images.agent_disk.image
        started = time.monotonic()
        baker = TemplateBaker(data_dir / "templates", data_dir / "r", print, bake_network)
        template = await baker.bake(spec, images, machine)
        print(f"\nbake of the busybox image: {time.monotonic() - started:.1f}s")
        host.service.add_template(template)

        sbx = (await agent.create(am.CreateSpec(sandbox_id=new("sb"), template=spec.name, workspace_id="ws"))).id
        assert await run(agent, sbx, "echo hi") == "hi\n"
        assert await run(agent, sbx, "id -un") == "app\n"  # the image's USER
        assert await run(agent, sbx, "pwd") == "/srv/app\n"  # its WORKDIR
        env = await run(agent, sbx, "env")
        assert "GREETING=hello from the image" in env.splitlines()
        assert not [v for v in env.splitlines() if v.startswith(("LC_ALL=", "PYTHON", "LD_"))], env
        root = await agent.exec(sbx, am.ExecRequest(cmd="id -u; pwd", user="root", cwd="/tmp"))
        assert (root.exit_code, root.stdout) == (0, "0\n/tmp\n")  # the request wins
        # the agent (this shell's parent) maps no shared object from the image
        maps = await run(agent, sbx, "grep '\\.so' /proc/$PPID/maps | grep -v ' /.cryobox/' || true")
        assert maps == "", maps
        assert await run(agent, sbx, "cat /proc/mounts | grep -c ' /.cryobox ext4 ro'") == "1\n"

        await agent.write_file(sbx, "/srv/app/note.txt", b"kept\n")
        assert await agent.read_file(sbx, "/srv/app/note.txt") == b"kept\n"

        snap = new("snap")
        await agent.snapshot(sbx, am.SnapshotRequest(snapshot_id=snap))
        restored = await agent.create(
            am.CreateSpec(
                sandbox_id=new("sb"),
                template=spec.name,
                workspace_id="ws",
                from_snapshot=am.SnapshotRef(id=snap, template=spec.name),
            )
        )
        assert await run(agent, restored.id, "cat /srv/app/note.txt") == "kept\n"

        child = await agent.fork(sbx, am.ForkRequest(child_id=new("sb")))  # a cold boot from a disk clone
        assert await run(agent, child.id, "cat /srv/app/note.txt; id -un") == "kept\napp\n"

        await agent.hibernate(sbx)
        await agent.wake(sbx)
        assert await run(agent, sbx, "cat /srv/app/note.txt") == "kept\n"
        for sandbox_id in (restored.id, child.id, sbx):
            await agent.delete(sandbox_id)
    finally:
        await host.close()
    assert find_own_qemus(data_dir / "host" / "vol" / "run") == []
    assert find_own_qemus(data_dir / "r") == []
