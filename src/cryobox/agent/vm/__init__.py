"""QEMU microVM driver."""

from .accel import Accel, detect_accel, host_tsc_khz
from .machine import MachineConfig, MemoryBacking, VmPaths
from .microvm import MicroVM, VmState

__all__ = ["Accel", "MachineConfig", "MemoryBacking", "MicroVM", "VmPaths", "VmState", "detect_accel", "host_tsc_khz"]
