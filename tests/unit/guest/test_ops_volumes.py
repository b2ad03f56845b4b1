"""The guest side of volumes, against a fake ``/sys/block``: which disk a volume is on (the host's name when its
capacity is the volume's, else the slot's serial), what mount(2) gets, what is refused, and the settle op."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cryobox.guest.agent import GuestAgent
from cryobox.guest.ops_files import OpError
from cryobox.guest.ops_resume import ResumeSystem
from cryobox.guest.ops_volumes import (
    MS_NODEV,
    MS_NOSUID,
    MS_RDONLY,
    VolumeMount,
    VolumeSettler,
    find_disk,
    mount_volumes,
    parse_mounts,
)
from tests.support.guest_volumes import fake_volumes, write_sys_block

Mount = tuple[str, str, str, int, str | None]


@pytest.fixture
def mounts() -> list[Mount]:
    return []


def _volume(tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "serial": "cbx-vol-rw0",
        "device": "vdb",
        "sectors": 8192,
        "path": str(tmp_path / "mnt" / "data"),
        "read_only": False,
    }
    return {**spec, **overrides}


def test_parse_mounts_refuses_what_the_host_never_sends(tmp_path: Path) -> None:
    assert parse_mounts(None) == ()
    good = _volume(tmp_path)
    (parsed,) = parse_mounts([good])
    assert parsed == VolumeMount("cbx-vol-rw0", "vdb", good["path"], False, 8192)
    for bad in (
        {"serial": "cbx-root"},
        {"serial": 7},
        {"device": "sda"},
        {"device": "vdb/../vda"},
        {"path": "relative"},
        {"path": "/"},
        {"path": "/a/../b"},
        {"read_only": "no"},
        {"sectors": -1},
        {"sectors": True},
    ):
        with pytest.raises(OpError) as err:
            parse_mounts([{**good, **bad}])
        assert err.value.code == "invalid_argument", bad
    with pytest.raises(OpError):
        parse_mounts([good, {**good, "serial": "cbx-vol-rw1"}])  # the same path twice
    with pytest.raises(OpError):
        parse_mounts([good] * 17)
    with pytest.raises(OpError):
        parse_mounts({"not": "a list"})


def test_the_hosts_device_is_taken_when_its_capacity_is_the_volumes(tmp_path: Path, mounts: list[Mount]) -> None:
    system = fake_volumes(tmp_path, lambda *a: mounts.append(a))
    (result,) = mount_volumes(parse_mounts([_volume(tmp_path)]), system)
    assert result["ok"] is True and result["device"] == "vdb"
    target = str(tmp_path / "mnt" / "data")
    assert mounts == [(f"{tmp_path}/dev/vdb", target, "ext4", MS_NOSUID | MS_NODEV, "noinit_itable")]
    assert (tmp_path / "mnt" / "data").is_dir()  # parents made too
    assert set(result["steps_ms"]) == {"find", "mkdir", "mount"}


def test_a_wrong_device_name_falls_back_to_the_serial(tmp_path: Path, mounts: list[Mount]) -> None:
    system = fake_volumes(tmp_path, lambda *a: mounts.append(a))
    # the host thought vdc (a VM with a data disk numbers its disks differently): vdc holds another capacity
    (mount,) = parse_mounts([_volume(tmp_path, device="vdc")])
    assert find_disk(mount, system) == "vdb"
    # no sectors known: by serial straight away
    assert find_disk(VolumeMount("cbx-vol-ro0", "vdb", "/x", True, 0), system) == "vdc"


def test_a_disk_without_capacity_or_serial_fails_that_volume_only(tmp_path: Path, mounts: list[Mount]) -> None:
    system = fake_volumes(tmp_path, lambda *a: mounts.append(a))
    empty = _volume(tmp_path, serial="cbx-vol-rw1", device="vdd", path=str(tmp_path / "e"))
    missing = _volume(tmp_path, serial="cbx-vol-rw3", device="vdf", path=str(tmp_path / "m"))
    results = mount_volumes(parse_mounts([empty, _volume(tmp_path), missing]), system)
    assert [r["ok"] for r in results] == [False, True, False]
    assert results[0]["error"].startswith("ENOMEDIUM") and results[2]["error"].startswith("ENODEV")
    assert [m[1] for m in mounts] == [str(tmp_path / "mnt" / "data")]


def test_read_only_volumes_are_mounted_read_only_without_journal_replay(tmp_path: Path, mounts: list[Mount]) -> None:
    system = fake_volumes(tmp_path, lambda *a: mounts.append(a))
    ro = _volume(tmp_path, serial="cbx-vol-ro0", device="vdc", sectors=4096, read_only=True, path=str(tmp_path / "r"))
    (result,) = mount_volumes(parse_mounts([ro]), system)
    assert result["ok"] is True
    assert mounts == [(f"{tmp_path}/dev/vdc", str(tmp_path / "r"), "ext4", MS_NOSUID | MS_NODEV | MS_RDONLY, "noload")]
    # a read-only volume on a disk the guest could write is refused (the host made a mistake)
    write_sys_block(tmp_path / "sys" / "block", {"vdc": {"ro": "0"}})
    (result,) = mount_volumes(parse_mounts([ro]), system)
    assert result["ok"] is False and result["error"].startswith("EROFS")


def test_a_mount_point_that_is_a_file_is_an_error(tmp_path: Path, mounts: list[Mount]) -> None:
    system = fake_volumes(tmp_path, lambda *a: mounts.append(a))
    (tmp_path / "file").write_text("x")
    (result,) = mount_volumes(parse_mounts([_volume(tmp_path, path=str(tmp_path / "file"))]), system)
    assert result["ok"] is False and "ENOTDIR" in result["error"] and mounts == []


def test_mount_failures_are_reported(tmp_path: Path) -> None:
    def refuse(*args: Any) -> None:
        raise OSError(22, "mount: Invalid argument")

    (result,) = mount_volumes(parse_mounts([_volume(tmp_path)]), fake_volumes(tmp_path, refuse))
    assert result["ok"] is False and result["error"].startswith("EINVAL")


def test_settle_syncs_then_freezes_or_unmounts(tmp_path: Path) -> None:
    events: list[tuple[str, str]] = []
    settler = VolumeSettler(fake_volumes(tmp_path, lambda *a: None, lambda op, path: events.append((op, path))))
    reply = settler({"paths": ["/mnt/a", "/mnt/b"]}, lambda event, data: None)
    assert reply == {"settled": {"/mnt/a": "frozen", "/mnt/b": "frozen"}, "errors": {}}
    assert events == [("sync", ""), ("freeze", "/mnt/a"), ("freeze", "/mnt/b")]
    events.clear()
    assert settler({"paths": ["/mnt/a"], "mode": "unmount"}, lambda e, d: None)["settled"] == {"/mnt/a": "unmounted"}
    assert events == [("sync", ""), ("umount", "/mnt/a")]
    for bad in ({"paths": "/mnt/a"}, {"paths": ["relative"]}, {"paths": [], "mode": "explode"}):
        with pytest.raises(OpError):
            settler(bad, lambda e, d: None)


def test_settle_reports_a_path_it_could_not_settle(tmp_path: Path) -> None:
    def other(op: str, path: str) -> None:
        if path == "/mnt/busy":
            raise OSError(16, "Device or resource busy")

    settler = VolumeSettler(fake_volumes(tmp_path, lambda *a: None, other))
    reply = settler({"paths": ["/mnt/busy", "/mnt/ok"], "mode": "unmount"}, lambda e, d: None)
    assert reply["settled"] == {"/mnt/ok": "unmounted"} and reply["errors"]["/mnt/busy"].startswith("EBUSY")


def test_the_agent_serves_volumes_settle(tmp_path: Path) -> None:
    events: list[tuple[str, str]] = []
    volumes = fake_volumes(tmp_path, lambda *a: None, lambda op, path: events.append((op, path)))
    agent = GuestAgent(clock_setter=lambda ns: None, resume_system=ResumeSystem(volumes=volumes))
    reply = agent.handle({"id": 1, "op": "volumes_settle", "args": {"paths": ["/mnt/a"]}})
    assert reply["ok"] is True and reply["result"]["settled"] == {"/mnt/a": "frozen"}
    assert events == [("sync", ""), ("freeze", "/mnt/a")]
