"""The few fields of a queued IPv4 TCP packet the egress gate reads (:mod:`.gate`): addresses, ports, sequence
number, flags and payload. Pure and total: anything that is not a whole IPv4 TCP packet parses to ``None``."""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

IPPROTO_TCP = 6
SYN = 0x02
RST = 0x04
ACK = 0x10


@dataclass(frozen=True, slots=True)
class TcpPacket:
    src: str
    dst: str
    sport: int
    dport: int
    seq: int
    flags: int
    payload: bytes

    @property
    def opens(self) -> bool:
        """A connection's first packet (SYN without ACK)."""
        return self.flags & (SYN | ACK | RST) == SYN


def parse_tcp(packet: bytes) -> TcpPacket | None:
    """The TCP segment in an IPv4 packet, or None (not IPv4/TCP, truncated, or a later fragment)."""
    if len(packet) < 20 or packet[0] >> 4 != 4:
        return None
    ihl = (packet[0] & 0x0F) * 4
    total = struct.unpack_from("!H", packet, 2)[0]
    fragment = struct.unpack_from("!H", packet, 6)[0] & 0x1FFF
    if ihl < 20 or packet[9] != IPPROTO_TCP or fragment or total > len(packet) or total < ihl + 20:
        return None
    sport, dport, seq = struct.unpack_from("!HHI", packet, ihl)
    offset = (packet[ihl + 12] >> 4) * 4
    if offset < 20 or ihl + offset > total:
        return None
    return TcpPacket(
        src=socket.inet_ntoa(packet[12:16]),
        dst=socket.inet_ntoa(packet[16:20]),
        sport=sport,
        dport=dport,
        seq=seq,
        flags=packet[ihl + 13],
        payload=bytes(packet[ihl + offset : total]),
    )


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return int(~total & 0xFFFF)


def reset_of(packet: bytes) -> bytes | None:
    """The TCP reset that ``packet`` (IPv4 TCP) becomes when it must not arrive: same addresses and ports, its
    sequence and acknowledgement numbers, RST|ACK, no options nor payload — its receiver takes it for the peer
    resetting the connection (the sequence number is the one it expects next)."""
    if parse_tcp(packet) is None:
        return None
    ihl = (packet[0] & 0x0F) * 4
    sport, dport, seq, ack = struct.unpack_from("!HHII", packet, ihl)
    tcp = struct.pack("!HHIIBBHHH", sport, dport, seq, ack, 5 << 4, RST | ACK, 0, 0, 0)
    src, dst = packet[12:16], packet[16:20]
    tcp_sum = _checksum(src + dst + struct.pack("!BBH", 0, IPPROTO_TCP, len(tcp)) + tcp)
    tcp = tcp[:16] + struct.pack("!H", tcp_sum) + tcp[18:]
    ip = struct.pack("!BBHHHBBH", 0x45, 0, 40, 0, 0x4000, 64, IPPROTO_TCP, 0) + src + dst
    ip = ip[:10] + struct.pack("!H", _checksum(ip)) + ip[12:]
    return ip + tcp


__all__ = ["ACK", "RST", "SYN", "TcpPacket", "parse_tcp", "reset_of"]
