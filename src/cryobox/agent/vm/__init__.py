"""QEMU microVM driver."""

from . import qemu
from .accel import Accel, detect_accel, host_tsc_khz
from .machine import GUEST_MAC, MachineConfig, MemoryBacking, NetAttach, VmPaths
from .microvm import MicroVM
from .states import VmState

__all__ = [
    "GUEST_MAC",
    "Accel",
    "MachineConfig",
    "MemoryBacking",
    "MicroVM",
    "NetAttach",
    "VmPaths",
    "VmState",
    "detect_accel",
    "host_tsc_khz",
    "qemu",
]
