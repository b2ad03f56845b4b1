"""Accelerator detection from fake /proc/cpuinfo and /sys/module trees."""

from __future__ import annotations

from pathlib import Path

import pytest

from cryobox.agent.vm.accel import Accel, detect_accel, host_tsc_khz
from cryobox.errors import InvalidArgument

INTEL_FLAGS = "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr vmx smx est tm2 ssse3 fma cx16 sse4_1 sse4_2 avx2"
AMD_FLAGS = "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr svm extapic cr8_legacy abm sse4a misalignsse"
PLAIN_FLAGS = "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr hypervisor sse4_1 sse4_2 avx2"


def _cpuinfo(tmp_path: Path, flags: str, mhz: str = "2400.000") -> Path:
    path = tmp_path / "cpuinfo"
    blocks = []
    for cpu in range(2):
        blocks.append(
            f"processor\t: {cpu}\n"
            "vendor_id\t: GenuineIntel\n"
            "model name\t: Test CPU @ 2.40GHz\n"
            f"cpu MHz\t\t: {mhz}\n"
            f"flags\t\t: {flags}\n"
            "bugs\t\t: spectre_v1 spectre_v2\n"
        )
    path.write_text("\n".join(blocks))
    return path


def _sys_module(tmp_path: Path, *modules: str) -> Path:
    root = tmp_path / "sys_module"
    root.mkdir()
    (root / "kvm").mkdir()  # the generic module alone proves nothing
    for name in modules:
        (root / name).mkdir()
    return root


@pytest.mark.parametrize(
    ("flags", "modules", "expected"),
    [
        (INTEL_FLAGS, ("kvm_intel",), Accel.KVM),
        (AMD_FLAGS, ("kvm_amd",), Accel.KVM),
        (INTEL_FLAGS, (), Accel.TCG),
        (AMD_FLAGS, (), Accel.TCG),
        (PLAIN_FLAGS, ("kvm_intel",), Accel.TCG),
        (PLAIN_FLAGS, (), Accel.TCG),
        (PLAIN_FLAGS, ("kvm_pvm",), Accel.TCG),
    ],
)
def test_detect_accel(tmp_path: Path, flags: str, modules: tuple[str, ...], expected: Accel) -> None:
    accel = detect_accel(env={}, cpuinfo=_cpuinfo(tmp_path, flags), sys_module=_sys_module(tmp_path, *modules))
    assert accel is expected


def test_vmx_substring_of_other_flag_is_not_vt(tmp_path: Path) -> None:
    cpuinfo = _cpuinfo(tmp_path, "fpu vmxe svmx tsc")
    assert detect_accel(env={}, cpuinfo=cpuinfo, sys_module=_sys_module(tmp_path, "kvm_intel")) is Accel.TCG


def test_vmx_only_in_non_flags_line_is_not_vt(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvmx flags\t: vnmi preemption_timer\nflags\t\t: fpu tsc\n")
    assert detect_accel(env={}, cpuinfo=cpuinfo, sys_module=_sys_module(tmp_path, "kvm_intel")) is Accel.TCG


def test_missing_cpuinfo_means_tcg(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    assert detect_accel(env={}, cpuinfo=missing, sys_module=_sys_module(tmp_path, "kvm_intel")) is Accel.TCG


@pytest.mark.parametrize(("value", "expected"), [("tcg", Accel.TCG), ("kvm", Accel.KVM), (" KVM \n", Accel.KVM)])
def test_env_override_wins(tmp_path: Path, value: str, expected: Accel) -> None:
    # hardware says the opposite of what the override asks for
    if expected is Accel.TCG:
        cpuinfo, modules = _cpuinfo(tmp_path, INTEL_FLAGS), _sys_module(tmp_path, "kvm_intel")
    else:
        cpuinfo, modules = _cpuinfo(tmp_path, PLAIN_FLAGS), _sys_module(tmp_path)
    assert detect_accel(env={"CRYOBOX_ACCEL": value}, cpuinfo=cpuinfo, sys_module=modules) is expected


def test_empty_env_override_is_ignored(tmp_path: Path) -> None:
    accel = detect_accel(
        env={"CRYOBOX_ACCEL": "  "},
        cpuinfo=_cpuinfo(tmp_path, INTEL_FLAGS),
        sys_module=_sys_module(tmp_path, "kvm_intel"),
    )
    assert accel is Accel.KVM


def test_invalid_env_override_raises(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="hvf"):
        detect_accel(env={"CRYOBOX_ACCEL": "hvf"}, cpuinfo=_cpuinfo(tmp_path, INTEL_FLAGS), sys_module=tmp_path)


def test_accel_properties() -> None:
    assert Accel.TCG.qemu_accel.startswith("tcg")
    assert "tb-size=" in Accel.TCG.qemu_accel
    assert Accel.KVM.qemu_accel == "kvm"
    assert Accel.KVM.cpu_model == "host"
    assert Accel.TCG.cpu_model == "max"
    assert Accel.TCG.needs_legacy_timers and not Accel.KVM.needs_legacy_timers
    assert Accel.TCG.default_norandmaps and not Accel.KVM.default_norandmaps


def test_tsc_from_sysfs(tmp_path: Path) -> None:
    sysfs = tmp_path / "tsc_freq_khz"
    sysfs.write_text("2995200\n")
    # dmesg and cpuinfo disagree: sysfs wins
    dmesg = "[    0.000000] tsc: Detected 1000.000 MHz processor\n"
    assert host_tsc_khz(sysfs=sysfs, cpuinfo=_cpuinfo(tmp_path, PLAIN_FLAGS, "1.0"), dmesg=dmesg) == 2995200


def test_tsc_garbage_sysfs_falls_back_to_dmesg(tmp_path: Path) -> None:
    sysfs = tmp_path / "tsc_freq_khz"
    sysfs.write_text("unknown\n")
    dmesg = "[    0.000000] tsc: Detected 2400.000 MHz processor\n"
    assert host_tsc_khz(sysfs=sysfs, cpuinfo=_cpuinfo(tmp_path, PLAIN_FLAGS, "1.0"), dmesg=dmesg) == 2_400_000


def test_tsc_refined_beats_detected(tmp_path: Path) -> None:
    dmesg = (
        "[    0.000000] tsc: Detected 2400.000 MHz processor\n"
        "[    0.004000] Calibrating delay loop (skipped), value calculated using timer frequency..\n"
        "[    1.234567] tsc: Refined TSC clocksource calibration: 2399.987 MHz\n"
    )
    khz = host_tsc_khz(sysfs=tmp_path / "missing", cpuinfo=_cpuinfo(tmp_path, PLAIN_FLAGS, "1.0"), dmesg=dmesg)
    assert khz == 2_399_987


def test_tsc_detected_only(tmp_path: Path) -> None:
    dmesg = "[    0.000000] tsc: Fast TSC calibration using PIT\n[    0.000000] tsc: Detected 3192.614 MHz processor\n"
    khz = host_tsc_khz(sysfs=tmp_path / "missing", cpuinfo=_cpuinfo(tmp_path, PLAIN_FLAGS, "1.0"), dmesg=dmesg)
    assert khz == 3_192_614


def test_tsc_from_cpuinfo(tmp_path: Path) -> None:
    khz = host_tsc_khz(sysfs=tmp_path / "missing", cpuinfo=_cpuinfo(tmp_path, PLAIN_FLAGS, "2893.204"), dmesg="")
    assert khz == 2_893_204


def test_tsc_default_when_nothing_known(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu\n")
    assert host_tsc_khz(sysfs=tmp_path / "missing", cpuinfo=cpuinfo, dmesg="") == 2_000_000
