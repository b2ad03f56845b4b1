"""``cryobox gc`` on real host resources: a data dir that was deleted (its owner record remains) loses its netns,
host link, nft table, hot dir, mount, QEMU and memory server; a live owner's (its lock held) are untouched, and
``--data-dir`` of the live one is refused. Everything is created here for two fake tags and removed in a finalizer;
no traffic is sent (the links stay down, the tables are empty)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyroute2 import IPRoute, netns

from cryobox.agent.host.ownership import Ownership, read_owners
from cryobox.agent.net.slots import tag_for
from cryobox.config import Paths

SLEEP = "import time; time.sleep(120)"


class Fixture:
    """Everything the test made, so the finalizer can remove it whatever gc did."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[subprocess.Popen[bytes]] = []
        self.netns: list[str] = []
        self.links: list[str] = []
        self.tables: list[str] = []
        self.dirs: list[Path] = []
        self.mounts: list[Path] = []

    def owner(self, name: str) -> tuple[Paths, str]:
        paths = Paths((self.tmp / name).resolve(), self.tmp / "cache")
        paths.data_dir.mkdir()
        self.dirs.append(paths.hot_dir)
        return paths, tag_for(paths.data_dir)

    def resources(self, paths: Paths, tag: str) -> None:
        """What an agent of ``paths`` leaves: a slot (netns + veth), its nft table, its hot dir, a QEMU."""
        name, link = f"cryobox-{tag}-0", f"cb{tag}h0"
        netns.create(name)
        self.netns.append(name)
        fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
        try:
            with IPRoute() as ipr:
                ipr.link("add", ifname=link, kind="veth", peer={"ifname": "eth0", "net_ns_fd": fd})
        finally:
            os.close(fd)
        self.links.append(link)
        table = f"cryobox_{tag}"
        subprocess.run(["nft", "add", "table", "inet", table], check=True)
        self.tables.append(table)
        paths.hot_dir.mkdir()
        (paths.hot_dir / "tpl-base-g1").write_bytes(b"\0" * 4096)
        qemu = self.tmp / "bin" / "qemu-system-x86_64"
        if not qemu.exists():
            qemu.parent.mkdir()
            qemu.symlink_to(sys.executable)
        pidfile = paths.run_dir / "vm-1" / "qemu.pid"
        self.spawn([str(qemu), "-c", SLEEP, "-pidfile", str(pidfile)], executable=str(qemu))

    def spawn(self, argv: list[str], executable: str | None = None) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(argv, executable=executable, stdin=subprocess.DEVNULL)
        self.procs.append(proc)
        return proc

    def cleanup(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        for mount in self.mounts:
            subprocess.run(["umount", "-l", str(mount)], capture_output=True, check=False)
        with IPRoute() as ipr:
            for link in self.links:
                for index in ipr.link_lookup(ifname=link):
                    ipr.link("del", index=index)
        for name in self.netns:
            if os.path.exists(f"/run/netns/{name}"):
                netns.remove(name)
        for table in self.tables:
            subprocess.run(["nft", "delete", "table", "inet", table], capture_output=True, check=False)
        for path in self.dirs:
            shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Fixture]:
    monkeypatch.delenv("CRYOBOX_HOT_DIR", raising=False)
    fixture = Fixture(tmp_path)
    try:
        yield fixture
    finally:
        fixture.cleanup()


def gc(owners: Path, *args: str) -> dict[str, object]:
    env = {**os.environ, "CRYOBOX_OWNERS_DIR": str(owners)}
    done = subprocess.run(
        [sys.executable, "-m", "cryobox.cli.main", "gc", "--json", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout)
    return result


def tables() -> str:
    return subprocess.run(["nft", "list", "tables", "inet"], capture_output=True, text=True, check=True).stdout


def present(made: Fixture, paths: Paths, tag: str) -> dict[str, bool]:
    return {
        "netns": os.path.exists(f"/run/netns/cryobox-{tag}-0"),
        "link": os.path.exists(f"/sys/class/net/cb{tag}h0"),
        "nft": f"table inet cryobox_{tag}\n" in tables(),
        "hot_dir": paths.hot_dir.exists(),
    }


@pytest.mark.timeout(120)
def test_gc_reclaims_a_deleted_data_dir_and_spares_a_live_one(made: Fixture, tmp_path: Path) -> None:
    owners = tmp_path / "owners"
    gone, gone_tag = made.owner("gone")
    live, live_tag = made.owner("live")

    Ownership(gone, owners).claim().release()  # an agent ran on it, then stopped (or crashed)
    made.resources(gone, gone_tag)
    memserver = made.spawn(
        [sys.executable, "-c", SLEEP, "cryobox.agent.memory.server.main", "--mount", str(gone.memserver_dir / "mnt")]
    )
    volume = gone.volume_dir
    volume.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "cryobox-gc-test", str(volume)], check=True)
    made.mounts.append(volume)
    shutil.rmtree(gone.data_dir, ignore_errors=True)  # a test's tmp dir wiped: only the busy mount point stays
    assert not (gone.data_dir / "agent.lock").exists() and os.path.ismount(volume)

    holder = Ownership(live, owners).claim()  # a live agent: this process holds its lock
    try:
        made.resources(live, live_tag)
        time.sleep(0.2)  # the fake QEMUs and memory server have exec'd
        assert all(p.poll() is None for p in made.procs)
        assert all(present(made, gone, gone_tag).values()) and all(present(made, live, live_tag).values())

        result = gc(owners)

        gone_qemu, live_qemu = made.procs[0], made.procs[2]
        assert present(made, gone, gone_tag) == {"netns": False, "link": False, "nft": False, "hot_dir": False}
        assert not os.path.ismount(volume)
        assert gone_qemu.wait(10) == -9 and memserver.wait(10) == -9
        assert [r.tag for r in read_owners(owners)] == [live_tag]  # the dead owner's record went with it
        reclaimed = result["reclaimed"]
        assert isinstance(reclaimed, list)
        assert all(item["ok"] for item in reclaimed), reclaimed
        assert {item["owner"] for item in reclaimed} == {str(gone.data_dir)}
        assert {item["kind"] for item in reclaimed} == {"kill", "unmount", "netns", "link", "nft", "hot_dir", "record"}

        # the live owner: untouched, and asking for it explicitly is refused while its lock is held
        assert all(present(made, live, live_tag).values()) and live_qemu.poll() is None
        refused = gc(owners, "--data-dir", str(live.data_dir))
        assert refused["reclaimed"] == [] and "in use" in str(refused["skipped"])
        assert all(present(made, live, live_tag).values()) and live_qemu.poll() is None

        # an unowned hot dir is only a candidate with --all-unowned (dry run: nothing is touched)
        stray = Path(f"/dev/shm/cryobox-{os.urandom(6).hex()}")
        stray.mkdir()
        made.dirs.append(stray)
        plain = gc(owners, "--dry-run")["would_reclaim"]
        assert isinstance(plain, list) and str(stray) not in {a["target"] for a in plain}
        dry = gc(owners, "--dry-run", "--all-unowned")
        would = dry["would_reclaim"]
        assert isinstance(would, list) and str(stray) in {a["target"] for a in would}
        assert all(a["owner"] == "unowned" for a in would) and live_tag not in {a["tag"] for a in would}
        assert stray.exists() and all(present(made, live, live_tag).values())
    finally:
        holder.release()


@pytest.mark.timeout(120)
def test_gc_of_a_kept_data_dir_asks_before_killing_its_vms(made: Fixture, tmp_path: Path) -> None:
    """``--data-dir`` of a data dir stopped with ``keep`` (no agent holds its lock, its VMs still run): without a
    terminal to ask on it refuses (exit 2) and touches nothing; with ``--force`` it reclaims everything."""
    owners = tmp_path / "owners"
    kept, kept_tag = made.owner("kept")
    Ownership(kept, owners).claim().release()  # an agent ran on it and stopped, keeping its sandboxes
    made.resources(kept, kept_tag)
    time.sleep(0.2)  # the fake QEMU has exec'd
    qemu = made.procs[-1]
    env = {**os.environ, "CRYOBOX_OWNERS_DIR": str(owners)}
    argv = [sys.executable, "-m", "cryobox.cli.main", "gc", "--data-dir", str(kept.data_dir)]
    refused = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, stdin=subprocess.DEVNULL)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "--force" in refused.stderr and "1 VM(s)" in refused.stderr
    assert qemu.poll() is None and all(present(made, kept, kept_tag).values())  # nothing was touched
    result = gc(owners, "--data-dir", str(kept.data_dir), "--force")
    assert qemu.wait(10) == -9
    assert present(made, kept, kept_tag) == {"netns": False, "link": False, "nft": False, "hot_dir": False}
    reclaimed = result["reclaimed"]
    assert isinstance(reclaimed, list) and all(item["ok"] for item in reclaimed), reclaimed
