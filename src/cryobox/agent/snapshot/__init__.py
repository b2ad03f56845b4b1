"""Snapshots of running VMs: the short pause (device state + written pages), memory layers, the local snapshot
store."""
