"""The ``inspect_net`` op: what the guest believes about the network, its clock and its identity.

Takes no args. Reply::

    {"sockets": [{"proto": "tcp"|"tcp6"|"udp"|"udp6", "local": "10.0.0.1:22", "remote": "[::1]:443",
                  "state": "LISTEN"}, ...],                  # /proc/net/{tcp,tcp6,udp,udp6}
     "neighbours": [{"ip", "mac", "device", "flags"}, ...],  # /proc/net/arp (IPv4); flags is the int ATF_* mask
     "resolv_conf": "nameserver 172.16.0.1\\n" | null,
     "interfaces": [{"name", "mac", "addresses": ["172.16.0.2/30", ...]}, ...],  # /sys/class/net + ``ip -j addr``
     "clock": {"realtime_ns", "monotonic_ns", "boottime_ns"},
     "instance_id": "sbx-123" | null}                        # /run/cryobox/instance-id

Everything is read-only; the roots and paths are injectable (:class:`InspectSources`) for tests.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import struct
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .ops_resume import INSTANCE_ID_PATH

Emit = Callable[[str, bytes], None]

SOCKET_FILES = ("tcp", "tcp6", "udp", "udp6")
TCP_STATES = {
    0x01: "ESTABLISHED",
    0x02: "SYN_SENT",
    0x03: "SYN_RECV",
    0x04: "FIN_WAIT1",
    0x05: "FIN_WAIT2",
    0x06: "TIME_WAIT",
    0x07: "CLOSE",
    0x08: "CLOSE_WAIT",
    0x09: "LAST_ACK",
    0x0A: "LISTEN",
    0x0B: "CLOSING",
    0x0C: "NEW_SYN_RECV",
}
# UDP sockets reuse TCP_ESTABLISHED (connected) and TCP_CLOSE (not connected); named like ``ss`` does.
UDP_STATES = {0x01: "ESTABLISHED", 0x07: "UNCONN"}
IP_TIMEOUT = 5.0
# The kernel prints each 32-bit address word of /proc/net/{tcp,udp}* in host byte order; every cryobox
# guest (x86_64, aarch64) is little-endian.
_WORD = struct.Struct("<I")


def decode_address(text: str) -> str:
    """``"0100007F:0016"`` -> ``"127.0.0.1:22"``; IPv6 (32 hex digits) -> ``"[::1]:22"``."""
    hex_ip, _, hex_port = text.partition(":")
    if len(hex_ip) not in (8, 32) or not hex_port:
        raise ValueError(f"not a /proc/net address: {text!r}")
    packed = b"".join(_WORD.pack(int(hex_ip[i : i + 8], 16)) for i in range(0, len(hex_ip), 8))
    port = int(hex_port, 16)
    ip = ipaddress.ip_address(packed)
    if isinstance(ip, ipaddress.IPv4Address):
        return f"{ip}:{port}"
    mapped = ip.ipv4_mapped  # Python 3.11 prints these as ::ffff:7f00:1; ss and the kernel as ::ffff:127.0.0.1
    return f"[::ffff:{mapped}]:{port}" if mapped is not None else f"[{ip}]:{port}"


def parse_socket_table(proto: str, text: str) -> list[dict[str, Any]]:
    """Rows of one /proc/net/{tcp,tcp6,udp,udp6} file (the header line and malformed lines are skipped)."""
    names = UDP_STATES if proto.startswith("udp") else TCP_STATES
    sockets: list[dict[str, Any]] = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 4 or not fields[0].endswith(":"):
            continue
        try:
            local, remote, state = decode_address(fields[1]), decode_address(fields[2]), int(fields[3], 16)
        except ValueError:
            continue
        sockets.append({"proto": proto, "local": local, "remote": remote, "state": names.get(state, f"0x{state:02X}")})
    return sockets


def parse_arp(text: str) -> list[dict[str, Any]]:
    """Rows of /proc/net/arp: ``IP address  HW type  Flags  HW address  Mask  Device``."""
    entries: list[dict[str, Any]] = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 6:
            continue
        try:
            flags = int(fields[2], 16)
        except ValueError:
            continue
        entries.append({"ip": fields[0], "mac": fields[3].lower(), "device": fields[5], "flags": flags})
    return entries


def parse_ip_addr_json(text: str) -> dict[str, list[str]]:
    """``ip -j addr`` output -> {interface: ["addr/prefix", ...]}."""
    result: dict[str, list[str]] = {}
    data = json.loads(text)
    if not isinstance(data, list):
        return result
    for link in data:
        if not isinstance(link, dict) or not isinstance(link.get("ifname"), str):
            continue
        addresses = result.setdefault(link["ifname"], [])
        for info in link.get("addr_info") or []:
            if isinstance(info, dict) and "local" in info and "prefixlen" in info:
                addresses.append(f"{info['local']}/{info['prefixlen']}")
    return result


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


@dataclass(frozen=True)
class InspectSources:
    proc_root: str = "/proc"
    sys_root: str = "/sys"
    resolv_conf: str = "/etc/resolv.conf"
    instance_id_path: str = INSTANCE_ID_PATH
    ip_command: str | None = "ip"  # looked up on PATH; None: report no addresses


class NetInspector:
    """The ``inspect_net`` op handler."""

    def __init__(self, sources: InspectSources | None = None) -> None:
        self.sources = sources or InspectSources()

    def __call__(self, args: dict[str, Any], emit: Emit) -> dict[str, Any]:
        return self.inspect()

    def sockets(self) -> list[dict[str, Any]]:
        sockets: list[dict[str, Any]] = []
        for proto in SOCKET_FILES:
            text = _read_text(os.path.join(self.sources.proc_root, "net", proto))
            if text is not None:
                sockets.extend(parse_socket_table(proto, text))
        return sockets

    def neighbours(self) -> list[dict[str, Any]]:
        text = _read_text(os.path.join(self.sources.proc_root, "net", "arp"))
        return [] if text is None else parse_arp(text)

    def addresses(self) -> dict[str, list[str]]:
        ip = shutil.which(self.sources.ip_command) if self.sources.ip_command else None
        if ip is None:
            return {}
        try:
            proc = subprocess.run(
                [ip, "-j", "addr", "show"], stdin=subprocess.DEVNULL, capture_output=True, timeout=IP_TIMEOUT
            )
            if proc.returncode != 0:
                return {}
            return parse_ip_addr_json(proc.stdout.decode(errors="replace"))
        except (OSError, subprocess.TimeoutExpired, ValueError):
            return {}

    def interfaces(self) -> list[dict[str, Any]]:
        net_dir = os.path.join(self.sources.sys_root, "class", "net")
        try:
            names = sorted(os.listdir(net_dir))
        except OSError:
            return []
        addresses = self.addresses()
        interfaces = []
        for name in names:
            mac = _read_text(os.path.join(net_dir, name, "address"))
            interfaces.append({"name": name, "mac": mac.strip() if mac else None, "addresses": addresses.get(name, [])})
        return interfaces

    def inspect(self) -> dict[str, Any]:
        instance_id = (_read_text(self.sources.instance_id_path) or "").strip() or None
        return {
            "sockets": self.sockets(),
            "neighbours": self.neighbours(),
            "resolv_conf": _read_text(self.sources.resolv_conf),
            "interfaces": self.interfaces(),
            "clock": {
                "realtime_ns": time.clock_gettime_ns(time.CLOCK_REALTIME),
                "monotonic_ns": time.clock_gettime_ns(time.CLOCK_MONOTONIC),
                "boottime_ns": time.clock_gettime_ns(time.CLOCK_BOOTTIME),
            },
            "instance_id": instance_id,
        }
