"""``volumes_release`` and ``volumes_mount`` against a fake ``/sys/block``: a release syncs, unmounts deepest first
and claims every volume's disk; a busy path (or a disk still held) stops it, mounts again what it had unmounted and
reports the path; a path the guest unmounted itself is skipped and not mounted afterwards; a mount mounts
shallowest first and answers in the order asked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cryobox.guest.agent import GuestAgent
from cryobox.guest.ops_resume import ResumeSystem
from cryobox.guest.ops_volume_release import VolumeHolds
from tests.support.guest_volumes import fake_volumes, write_sys_block

EBUSY = OSError(16, "Device or resource busy")


def _volume(path: str, serial: str = "cbx-vol-rw0", device: str = "vdb", sectors: int = 8192) -> dict[str, Any]:
    return {"serial": serial, "device": device, "sectors": sectors, "path": path, "read_only": serial[8:10] == "ro"}


class Events:
    def __init__(self, busy: dict[tuple[str, str], OSError] | None = None) -> None:
        self.log: list[tuple[str, str]] = []
        self.busy = busy or {}

    def other(self, op: str, path: str) -> None:
        self.log.append((op, path))
        if (op, path) in self.busy:
            raise self.busy[(op, path)]

    def mount(self, source: str, target: str, fstype: str, flags: int, data: str | None) -> None:
        self.log.append(("mount", target))


def _holds(tmp_path: Path, events: Events) -> VolumeHolds:
    return VolumeHolds(fake_volumes(tmp_path, events.mount, events.other))


def _pair(tmp_path: Path) -> list[dict[str, Any]]:
    outer, inner = str(tmp_path / "data"), str(tmp_path / "data" / "ref")
    return [_volume(outer), _volume(inner, "cbx-vol-ro0", "vdc", 4096)]


def test_a_release_syncs_unmounts_deepest_first_and_claims_every_disk(tmp_path: Path) -> None:
    events = Events()
    volumes = _pair(tmp_path)
    disk = {"serial": "cbx-vol-rw1", "device": "vdd", "sectors": 2048}  # attached, not mounted by the platform
    holds = _holds(tmp_path, events)
    write_sys_block(tmp_path / "sys" / "block", {"vdd": {"size": "2048"}})
    reply = holds.release_op({"volumes": volumes, "disks": [disk]}, lambda e, d: None)
    outer, inner = volumes[0]["path"], volumes[1]["path"]
    assert reply["ok"] is True and reply["released"] == [inner, outer]
    dev = f"{tmp_path}/dev"
    assert events.log == [
        ("sync", ""),
        ("umount", inner),
        ("umount", outer),
        ("claim", f"{dev}/vdb"),
        ("claim", f"{dev}/vdc"),
        ("claim", f"{dev}/vdd"),
    ]


def test_a_busy_path_is_reported_and_what_was_unmounted_is_mounted_again(tmp_path: Path) -> None:
    volumes = _pair(tmp_path)
    outer, inner = volumes[0]["path"], volumes[1]["path"]
    events = Events({("umount", outer): EBUSY})
    reply = _holds(tmp_path, events).release_op({"volumes": volumes}, lambda e, d: None)
    assert reply["ok"] is False and reply["step"] == "umount" and reply["path"] == outer
    assert reply["error"].startswith("EBUSY") and "remount_errors" not in reply
    assert events.log == [("sync", ""), ("umount", inner), ("umount", outer), ("mount", inner)]


def test_a_disk_still_held_after_the_unmount_is_busy_too(tmp_path: Path) -> None:
    volumes = _pair(tmp_path)
    outer, inner = volumes[0]["path"], volumes[1]["path"]
    events = Events({("claim", f"{tmp_path}/dev/vdc"): EBUSY})  # a bind mount of the read-only volume elsewhere
    reply = _holds(tmp_path, events).release_op({"volumes": volumes}, lambda e, d: None)
    assert (reply["ok"], reply["step"], reply["path"], reply["device"]) == (False, "claim", inner, "vdc")
    assert [e for e in events.log if e[0] == "mount"] == [("mount", outer), ("mount", inner)]  # shallowest first


def test_a_path_the_guest_unmounted_itself_is_skipped_and_left_so(tmp_path: Path) -> None:
    volumes = _pair(tmp_path)
    outer, inner = volumes[0]["path"], volumes[1]["path"]
    events = Events({("umount", inner): OSError(22, "Invalid argument")})
    reply = _holds(tmp_path, events).release_op({"volumes": volumes}, lambda e, d: None)
    assert reply["ok"] is True and reply["released"] == [outer]


def test_mount_goes_shallowest_first_and_answers_in_order(tmp_path: Path) -> None:
    events = Events()
    volumes = list(reversed(_pair(tmp_path)))
    reply = _holds(tmp_path, events).mount_op({"volumes": volumes}, lambda e, d: None)
    assert [r["path"] for r in reply["volumes"]] == [v["path"] for v in volumes]
    assert all(r["ok"] for r in reply["volumes"])
    assert events.log == [("mount", volumes[1]["path"]), ("mount", volumes[0]["path"])]


def test_the_agent_serves_both_and_refuses_bad_input(tmp_path: Path) -> None:
    events = Events()
    agent = GuestAgent(
        clock_setter=lambda ns: None,
        resume_system=ResumeSystem(volumes=fake_volumes(tmp_path, events.mount, events.other)),
    )
    path = str(tmp_path / "v")
    reply = agent.handle({"id": 1, "op": "volumes_release", "args": {"volumes": [_volume(path)]}})
    assert reply["ok"] is True and reply["result"]["released"] == [path]
    reply = agent.handle({"id": 2, "op": "volumes_mount", "args": {"volumes": [_volume(path)]}})
    assert reply["ok"] is True and reply["result"]["volumes"][0]["ok"] is True
    for bad in ({"volumes": "x"}, {"volumes": [], "disks": [{"serial": "nope", "device": "vdb"}]}):
        reply = agent.handle({"id": 3, "op": "volumes_release", "args": bad})
        assert reply["ok"] is False and reply["error"]["code"] == "invalid_argument", reply
