"""Quiesce check: a guest holding established TCP connections must not be snapshotted as a template
(every restore would resume a connection whose peer never heard of it)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from ...errors import CryoboxError, StateError
from ...util.encoding import unb64
from ..guest.client import GuestClient

ESTABLISHED = "01"
LISTEN = "0A"


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


def listening(proc_net_tcp: str) -> set[int]:
    """The TCP ports something listens on, from the text of ``/proc/net/tcp{,6}``."""
    ports = set()
    for line in proc_net_tcp.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[0].endswith(":") and fields[3] == LISTEN:
            ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


async def proc_net_tcp(guest: GuestClient) -> str:
    """The guest's ``/proc/net/tcp`` and ``tcp6``, read by its agent (nothing of the image's userland runs)."""
    text = ""
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            reply = await guest.call("read_file", {"path": path})
        except CryoboxError:
            continue  # no IPv6 in the guest
        text += unb64(reply.get("content")).decode(errors="replace")
    return text


async def listening_ports(guest: GuestClient) -> set[int]:
    return listening(await proc_net_tcp(guest))


async def require_quiesced(guest: GuestClient, what: str) -> None:
    """Refuse ``what`` (StateError, listing them) while the guest holds established TCP connections."""
    connections = established_connections(await proc_net_tcp(guest))
    if connections:
        raise StateError(
            f"refusing to {what}: the guest holds established TCP connections: " + ", ".join(map(str, connections)),
            state="connected",
            required="quiesced",
            details={"connections": [str(c) for c in connections]},
        )
