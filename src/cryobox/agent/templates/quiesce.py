"""Quiesce check: a guest holding established TCP connections must not be snapshotted as a template
(every restore would resume a connection whose peer never heard of it)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from ...errors import StateError
from ..guest.client import GuestClient
from ..guest.exec import run_exec

ESTABLISHED = "01"


@dataclass(frozen=True)
class TcpConnection:
    local: str
    remote: str

    def __str__(self) -> str:
        return f"{self.local} -> {self.remote}"


def _endpoint(hex_endpoint: str) -> str:
    address, port = hex_endpoint.split(":")
    raw = bytes.fromhex(address)
    # /proc/net/tcp{,6} print each 32-bit word in host (little-endian) order
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    ip = ipaddress.ip_address(words)
    return f"[{ip}]:{int(port, 16)}" if ip.version == 6 else f"{ip}:{int(port, 16)}"


def established_connections(proc_net_tcp: str) -> list[TcpConnection]:
    """Parse the concatenated text of ``/proc/net/tcp`` and ``/proc/net/tcp6``."""
    found = []
    for line in proc_net_tcp.splitlines():
        fields = line.split()
        if len(fields) < 4 or fields[0] == "sl" or not fields[0].endswith(":"):
            continue
        if fields[3] == ESTABLISHED:
            found.append(TcpConnection(local=_endpoint(fields[1]), remote=_endpoint(fields[2])))
    return found


async def require_quiesced(guest: GuestClient, what: str) -> None:
    """Refuse ``what`` (StateError, listing them) while the guest holds established TCP connections."""
    tcp = await run_exec(guest, "cat /proc/net/tcp /proc/net/tcp6 2>/dev/null", timeout_s=30)
    connections = established_connections(tcp.stdout)
    if connections:
        raise StateError(
            f"refusing to {what}: the guest holds established TCP connections: " + ", ".join(map(str, connections)),
            state="connected",
            required="quiesced",
            details={"connections": [str(c) for c in connections]},
        )
