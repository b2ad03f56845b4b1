"""The jail's settings (uid ranges, env switches, cgroup limits) and the spec it hands the launcher, built from tmp
files (nothing is launched; the QEMU version is monkeypatched)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from cryobox.agent.vm import jail, qemu
from cryobox.agent.vm.accel import Accel
from cryobox.agent.vm.cgroups import CgroupHost, Limits
from cryobox.agent.vm.jail import (
    EXTRA_UIDS,
    KNOWN_NODES,
    OVERHEAD_MIB,
    PIDS_MAX,
    SLOT_UIDS,
    UID_RANGE,
    JailSettings,
    jail_enabled,
    limits_for,
    prepare_host,
)
from cryobox.agent.vm.machine import MachineConfig, NetAttach
from cryobox.errors import InvalidArgument, VmmError
from tests.support.jail import BASE, Vm, bind_modes, qemu_img_create, vm_config

TAG, OTHER_TAG = "abc123", "def456"
SetVersion = Callable[[tuple[int, int]], None]


@pytest.fixture
def set_version(monkeypatch: pytest.MonkeyPatch) -> SetVersion:
    def set_to(version: tuple[int, int]) -> None:
        monkeypatch.setattr(qemu, "version", lambda: version)
        monkeypatch.setattr(qemu, "version_line", lambda: f"QEMU emulator version {version[0]}.{version[1]}.0")

    return set_to


@pytest.fixture
def detected(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """``CgroupHost.detect`` records its tag and finds nothing (the host's ``/proc`` is not read)."""
    tags: list[str] = []

    def detect(cls: type[CgroupHost], tag: str, proc: Path = Path("/proc/self")) -> CgroupHost | None:
        tags.append(tag)
        return None

    monkeypatch.setattr(CgroupHost, "detect", classmethod(detect))
    return tags


# --- settings ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "enabled"),
    [("on", True), ("off", False), ("1", True), ("0", False), ("true", True), ("false", False), (" OFF ", False)],
)
def test_jail_enabled_values(value: str, enabled: bool) -> None:
    assert jail_enabled({"CRYOBOX_JAIL": value}) is enabled


def test_jail_enabled_defaults_on_and_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert jail_enabled({}) is True
    monkeypatch.setenv("CRYOBOX_JAIL", "off")
    assert jail_enabled() is False
    monkeypatch.delenv("CRYOBOX_JAIL")
    assert jail_enabled() is True


@pytest.mark.parametrize("value", ["maybe", "yes", "2", ""])
def test_jail_enabled_refuses_other_values(value: str) -> None:
    with pytest.raises(InvalidArgument, match="CRYOBOX_JAIL"):
        jail_enabled({"CRYOBOX_JAIL": value})


def test_for_tag_off_is_none(detected: list[str]) -> None:
    assert JailSettings.for_tag(TAG, env={"CRYOBOX_JAIL": "off"}) is None
    assert JailSettings.for_tag(TAG, env={"CRYOBOX_JAIL": "0", "CRYOBOX_JAIL_UID_BASE": "junk"}) is None
    assert detected == []


def test_for_tag_honours_the_uid_base(detected: list[str]) -> None:
    settings = JailSettings.for_tag(TAG, env={"CRYOBOX_JAIL_UID_BASE": " 5000 "})
    assert settings is not None
    assert settings.uid_base == 5000
    assert settings.uid_range == range(5000, 5000 + UID_RANGE)
    assert settings.cgroups is None
    assert detected == [TAG]
    top = (1 << 31) - UID_RANGE
    for edge in (1000, top):
        edged = JailSettings.for_tag(TAG, env={"CRYOBOX_JAIL_UID_BASE": str(edge)})
        assert edged is not None and edged.uid_base == edge


@pytest.mark.parametrize("value", ["999", "0", "-5", str((1 << 31) - UID_RANGE + 1), str(1 << 40)])
def test_for_tag_refuses_a_base_out_of_range(value: str, detected: list[str]) -> None:
    with pytest.raises(InvalidArgument, match="outside"):
        JailSettings.for_tag(TAG, env={"CRYOBOX_JAIL_UID_BASE": value})


@pytest.mark.parametrize("value", ["abc", "12.5", "1e6", "0x1000"])
def test_for_tag_refuses_a_non_integer_base(value: str, detected: list[str]) -> None:
    with pytest.raises(InvalidArgument, match="integer"):
        JailSettings.for_tag(TAG, env={"CRYOBOX_JAIL_UID_BASE": value})


def test_default_base_per_tag(detected: list[str]) -> None:
    one, other = JailSettings.for_tag(TAG, env={}), JailSettings.for_tag(OTHER_TAG, env={})
    assert one is not None and other is not None
    assert one.uid_base != other.uid_base
    assert min(one.uid_base, other.uid_base) >= 1_000_000
    assert not set(one.uid_range) & set(other.uid_range)  # the ranges never overlap
    assert max(one.uid_range[-1], other.uid_range[-1]) < 1 << 31
    again = JailSettings.for_tag(TAG, env={})
    assert again is not None and again.uid_base == one.uid_base  # stable across starts
    assert jail.default_uid_base("ffffff") + UID_RANGE <= (1 << 31) - UID_RANGE


def test_uid_bounds_and_image_gid() -> None:
    settings = JailSettings(uid_base=BASE, cgroups=None)
    assert settings.slot_uid(0) == BASE
    assert settings.slot_uid(SLOT_UIDS - 1) == BASE + SLOT_UIDS - 1
    assert settings.extra_uid(0) == BASE + SLOT_UIDS
    assert settings.extra_uid(EXTRA_UIDS - 1) == BASE + UID_RANGE - 2
    for bad_slot in (-1, SLOT_UIDS):
        with pytest.raises(VmmError):
            settings.slot_uid(bad_slot)
    for bad_extra in (-1, EXTRA_UIDS):
        with pytest.raises(VmmError):
            settings.extra_uid(bad_extra)

    assert settings.image_gid == settings.uid_range[-1] == BASE + UID_RANGE - 1
    uids = {settings.slot_uid(i) for i in range(SLOT_UIDS)} | {settings.extra_uid(i) for i in range(EXTRA_UIDS)}
    assert len(uids) == SLOT_UIDS + EXTRA_UIDS == UID_RANGE - 1
    assert settings.image_gid not in uids
    assert uids | {settings.image_gid} == set(settings.uid_range)


def test_limits_for(tmp_path: Path) -> None:
    assert limits_for(vm_config(tmp_path, Accel.TCG, memory_mib=512, cpus=2)) == Limits(
        memory_bytes=(512 + 384) << 20, cpus=3.0, pids=256
    )
    assert limits_for(vm_config(tmp_path, Accel.KVM, memory_mib=1024, cpus=1)) == Limits(
        memory_bytes=(1024 + OVERHEAD_MIB[Accel.KVM]) << 20, cpus=2.0, pids=PIDS_MAX
    )
    assert OVERHEAD_MIB[Accel.KVM] == 192 and PIDS_MAX == 256


# --- the spec ---------------------------------------------------------------------------------------------------


def _of(spec: list[list[str]], kind: str) -> list[list[str]]:
    return [fields for fields in spec if fields[0] == kind]


def _node(path: str) -> list[str]:
    try:
        rdev = os.stat(path).st_rdev
        numbers = (os.major(rdev), os.minor(rdev))
    except OSError:
        numbers = KNOWN_NODES[path]
    return ["mknod", path, str(numbers[0]), str(numbers[1])]


def test_private_readonly_follows_the_version(set_version: SetVersion) -> None:
    for version, readonly in (((7, 2), False), ((8, 1), False), ((8, 2), True), ((10, 0), True)):
        set_version(version)
        assert qemu.private_readonly() is readonly


@pytest.mark.parametrize(
    ("version", "share", "memory_mode", "groups"),
    [
        ((7, 2), False, "rw", True),  # QEMU < 8.2 opens even a private RAM file read-write
        ((7, 2), True, "rw", False),
        ((10, 0), False, "ro", True),  # the memory server's files are the image group's only
        ((10, 0), True, "rw", False),
    ],
)
def test_spec_binds_and_identity(
    tmp_path: Path, set_version: SetVersion, version: tuple[int, int], share: bool, memory_mode: str, groups: bool
) -> None:
    set_version(version)
    vm = Vm(tmp_path, share=share)

    spec = vm.spec()

    assert spec[0] == ["root", str(tmp_path / "vm" / "jail")]
    assert _of(spec, "root") == [spec[0]]
    binds = bind_modes(spec)
    assert binds[str(vm.paths.root)] == "rw"
    assert binds[str(vm.config.kernel)] == "ro"
    assert binds[str(vm.config.initrd)] == "ro"
    assert binds[str(vm.base)] == "ro"
    assert binds[str(vm.raw)] == "ro"
    assert binds[str(vm.memory.path)] == memory_mode
    assert str(vm.disk) not in binds  # inside the run dir, which is bound already
    assert binds["/usr"] == "ro"
    assert _of(spec, "uid") == [["uid", str(BASE + 3)]] and _of(spec, "gid") == [["gid", str(BASE + 3)]]
    assert _of(spec, "groups") == ([["groups", str(vm.settings.image_gid)]] if groups else [])
    assert _of(spec, "netns") == [] and _of(spec, "tap") == []
    assert _of(spec, "mknod") == [_node("/dev/userfaultfd")]
    assert ["dev", "/dev/null"] in spec and ["dev", "/dev/urandom"] in spec
    assert not any(fields[0] == "cgroup" for fields in spec)  # added by launch, with the cgroups


def test_spec_with_a_net_enters_its_namespace_and_owns_a_tun(tmp_path: Path, set_version: SetVersion) -> None:
    set_version((10, 0))
    vm = Vm(tmp_path, share=False)

    spec = vm.spec(NetAttach("ns1"))

    assert _of(spec, "netns") == [["netns", "/run/netns/ns1"]]
    assert _of(spec, "tap") == [["tap", "tap0"]]
    assert spec.index(["netns", "/run/netns/ns1"]) > 0  # after the root
    assert _of(spec, "mknod") == [_node("/dev/userfaultfd"), _node("/dev/net/tun")]
    # the rest is the same as without a net
    plain = vm.spec(None)
    assert [f for f in spec if f[0] not in ("netns", "tap", "mknod")] == [f for f in plain if f[0] != "mknod"]


def test_spec_under_kvm_owns_a_kvm_node(tmp_path: Path, set_version: SetVersion) -> None:
    set_version((10, 0))
    vm = Vm(tmp_path, share=False)
    kvm = vm_config(tmp_path, Accel.KVM)
    assert _of(vm.spec(None, kvm), "mknod") == [_node("/dev/userfaultfd"), _node("/dev/kvm")]


def test_spec_binds_a_disk_outside_the_run_dir_rw(tmp_path: Path, set_version: SetVersion) -> None:
    set_version((10, 0))
    vm = Vm(tmp_path, share=False)
    outside = tmp_path / "volumes" / "disk.qcow2"
    outside.parent.mkdir()
    qemu_img_create("-F", "qcow2", "-b", str(vm.base), str(outside))
    binds = bind_modes(vm.jail.spec(vm.config, vm.paths, vm.memory, outside, None))
    assert binds[str(outside)] == "rw"
    assert binds[str(vm.base)] == "ro" and binds[str(vm.raw)] == "ro"


@pytest.mark.parametrize("bad", ["kernel", "netns"])
def test_a_tab_or_newline_in_the_spec_is_refused(tmp_path: Path, set_version: SetVersion, bad: str) -> None:
    set_version((10, 0))
    vm = Vm(tmp_path, share=False)
    if bad == "kernel":
        kernel = tmp_path / "cache" / "vmlinuz\tevil"
        kernel.write_bytes(b"kernel")
        with pytest.raises(VmmError, match="tab or newline"):
            vm.spec(None, MachineConfig.from_json({**vm.config.to_json(), "kernel": str(kernel)}))
    else:
        with pytest.raises(VmmError, match="tab or newline"):
            vm.spec(NetAttach("ns1\nroot\t/"))


# --- the host ---------------------------------------------------------------------------------------------------


def test_prepare_host_on_old_qemu_enables_unprivileged_userfaultfd(tmp_path: Path, set_version: SetVersion) -> None:
    set_version((7, 2))
    sysctl = tmp_path / "unprivileged_userfaultfd"
    sysctl.write_text("0\n")

    weakened = prepare_host(JailSettings(uid_base=BASE, cgroups=None), sysctl=sysctl)

    assert sysctl.read_text() == "1"
    assert len(weakened) == 2
    assert any("unprivileged_userfaultfd=1" in w for w in weakened)
    assert any("writable" in w for w in weakened)


def test_prepare_host_on_old_qemu_fails_without_the_sysctl(tmp_path: Path, set_version: SetVersion) -> None:
    set_version((7, 2))
    with pytest.raises(VmmError, match=r"version 7\.2\.0 needs .*/missing/sysctl = 1"):
        prepare_host(JailSettings(uid_base=BASE, cgroups=None), sysctl=tmp_path / "missing" / "sysctl")


def test_prepare_host_on_new_qemu_touches_nothing(tmp_path: Path, set_version: SetVersion) -> None:
    set_version((10, 0))
    sysctl = tmp_path / "unprivileged_userfaultfd"
    sysctl.write_text("0\n")
    before = sysctl.stat().st_mtime_ns

    assert prepare_host(JailSettings(uid_base=BASE, cgroups=None), sysctl=sysctl) == []

    assert sysctl.read_text() == "0\n" and sysctl.stat().st_mtime_ns == before
    assert prepare_host(JailSettings(uid_base=BASE, cgroups=None), sysctl=tmp_path / "missing") == []
