"""Accelerator detection: KVM only where the CPU exposes VT-x/AMD-V and kvm_intel/kvm_amd is loaded.

``/dev/kvm`` alone proves nothing: on our development machines it is ``kvm_pvm`` (no VT-x), under which a stock
Linux guest cannot boot, so those hosts run guests under TCG.
"""

from __future__ import annotations

import enum
import functools
import os
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path

from ...errors import InvalidArgument


class Accel(enum.Enum):
    KVM = "kvm"
    TCG = "tcg"

    @property
    def qemu_accel(self) -> str:
        """The ``-accel`` argument. TCG keeps a small translation cache: the 1 GiB default wrecks density."""
        return "kvm" if self is Accel.KVM else "tcg,thread=multi,tb-size=64"

    @property
    def cpu_model(self) -> str:
        return "host" if self is Accel.KVM else "max"

    @property
    def needs_legacy_timers(self) -> bool:
        """microvm under TCG hangs in TSC calibration without the PIT/PIC/RTC and ``tsc_early_khz``."""
        return self is Accel.TCG

    @property
    def default_norandmaps(self) -> bool:
        """TCG caches translations by guest virtual address; ASLR defeats that (exec ``true``: 30 -> 8 ms)."""
        return self is Accel.TCG


def detect_accel(
    env: Mapping[str, str] | None = None,
    cpuinfo: Path = Path("/proc/cpuinfo"),
    sys_module: Path = Path("/sys/module"),
) -> Accel:
    env = os.environ if env is None else env
    forced = env.get("CRYOBOX_ACCEL", "").strip().lower()
    if forced:
        try:
            return Accel(forced)
        except ValueError:
            raise InvalidArgument(f"CRYOBOX_ACCEL must be 'kvm' or 'tcg', not {forced!r}") from None
    try:
        flags = cpuinfo.read_text()
    except OSError:
        return Accel.TCG
    has_vt = re.search(r"^flags\s*:.*\b(vmx|svm)\b", flags, re.MULTILINE) is not None
    has_module = (sys_module / "kvm_intel").exists() or (sys_module / "kvm_amd").exists()
    return Accel.KVM if has_vt and has_module else Accel.TCG


@functools.cache
def host_tsc_khz(
    sysfs: Path = Path("/sys/devices/system/cpu/cpu0/tsc_freq_khz"),
    cpuinfo: Path = Path("/proc/cpuinfo"),
    dmesg: str | None = None,
) -> int:
    """The host TSC rate in kHz, passed to TCG guests as ``tsc_early_khz`` (PIT calibration is unreliable). Read
    once per process (``dmesg`` is a subprocess: 0.1 s of a restart's start on a busy host)."""
    try:
        return int(sysfs.read_text().strip())
    except (OSError, ValueError):
        pass
    if dmesg is None:
        try:
            dmesg = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=5).stdout
        except (OSError, subprocess.SubprocessError):
            dmesg = ""
    for pattern in (r"Refined TSC clocksource calibration: ([0-9.]+) MHz", r"tsc: Detected ([0-9.]+) MHz"):
        match = re.search(pattern, dmesg)
        if match:
            return round(float(match.group(1)) * 1000)
    match = re.search(r"^cpu MHz\s*:\s*([0-9.]+)", cpuinfo.read_text(), re.MULTILINE)
    if match:
        return round(float(match.group(1)) * 1000)
    return 2_000_000
