"""Flush the kernel's neighbour (ARP/NDP) table over rtnetlink, with nothing but the stdlib.

Equivalent to ``ip neigh flush all``: one ``RTM_GETNEIGH`` dump, then one ``RTM_DELNEIGH`` per entry that
is not ``NUD_PERMANENT``/``NUD_NOARP`` (nor a proxy entry), each acknowledged before the next is sent.
A restored guest's neighbour entries describe the network it was snapshotted on; after the flush the
kernel re-resolves on first use.

Message packing and parsing are pure functions over bytes (unit-tested without a socket); only
:class:`RouteSocket` talks to the kernel, and :func:`flush_neighbours` takes a socket factory.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import socket
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

# netlink message header: length, type, flags, sequence, port id (struct nlmsghdr)
NLMSG_HDR = struct.Struct("=IHHII")
# struct ndmsg: family, pad1, pad2, ifindex, state, flags, type
NDMSG = struct.Struct("=BBHiHBB")
# struct rtattr: length, type
RTATTR = struct.Struct("=HH")
# struct nlmsgerr starts with a signed int: 0 (ack) or -errno
NLMSG_ERRNO = struct.Struct("=i")

NLMSG_NOOP = 1
NLMSG_ERROR = 2
NLMSG_DONE = 3
NLMSG_OVERRUN = 4

RTM_NEWNEIGH = 28
RTM_DELNEIGH = 29
RTM_GETNEIGH = 30

NLM_F_REQUEST = 0x01
NLM_F_MULTI = 0x02
NLM_F_ACK = 0x04
NLM_F_ROOT = 0x100
NLM_F_MATCH = 0x200
NLM_F_DUMP = NLM_F_ROOT | NLM_F_MATCH

NDA_DST = 1
NDA_LLADDR = 2
NLA_TYPE_MASK = 0x3FFF  # strip NLA_F_NESTED / NLA_F_NET_BYTEORDER

NUD_INCOMPLETE = 0x01
NUD_REACHABLE = 0x02
NUD_STALE = 0x04
NUD_DELAY = 0x08
NUD_PROBE = 0x10
NUD_FAILED = 0x20
NUD_NOARP = 0x40
NUD_PERMANENT = 0x80
NTF_PROXY = 0x08

RECV_SIZE = 256 * 1024  # larger than any single dump batch the kernel sends
SOCKET_TIMEOUT = 5.0


class NetlinkError(OSError):
    """A malformed message, or an error the kernel reported."""


def align4(n: int) -> int:
    return (n + 3) & ~3


@dataclass(frozen=True)
class NetlinkMessage:
    type: int
    flags: int
    seq: int
    pid: int
    payload: bytes


@dataclass(frozen=True)
class Neighbour:
    family: int
    ifindex: int
    state: int
    flags: int
    type: int
    dst: bytes | None
    lladdr: bytes | None

    @property
    def ip(self) -> str | None:
        if self.dst is None:
            return None
        try:
            return str(ipaddress.ip_address(self.dst))
        except ValueError:
            return self.dst.hex()

    @property
    def mac(self) -> str | None:
        return None if self.lladdr is None else ":".join(f"{b:02x}" for b in self.lladdr)


# --- packing ---------------------------------------------------------------------------------------


def pack_message(msg_type: int, flags: int, seq: int, payload: bytes, pid: int = 0) -> bytes:
    length = NLMSG_HDR.size + len(payload)
    padding = b"\0" * (align4(length) - length)
    return NLMSG_HDR.pack(length, msg_type, flags, seq, pid) + payload + padding


def pack_attr(attr_type: int, data: bytes) -> bytes:
    length = RTATTR.size + len(data)
    return RTATTR.pack(length, attr_type) + data + b"\0" * (align4(length) - length)


def pack_ndmsg(
    family: int = socket.AF_UNSPEC, ifindex: int = 0, state: int = 0, flags: int = 0, ntype: int = 0
) -> bytes:
    return NDMSG.pack(family, 0, 0, ifindex, state, flags, ntype)


def pack_getneigh_dump(seq: int) -> bytes:
    """Request a dump of every IPv4 and IPv6 neighbour entry."""
    return pack_message(RTM_GETNEIGH, NLM_F_REQUEST | NLM_F_DUMP, seq, pack_ndmsg())


def pack_delneigh(seq: int, neighbour: Neighbour) -> bytes:
    """Request (with an ack) the deletion of one entry, identified by family, ifindex and destination."""
    if neighbour.dst is None:
        raise ValueError("cannot delete a neighbour entry without a destination")
    payload = pack_ndmsg(neighbour.family, neighbour.ifindex) + pack_attr(NDA_DST, neighbour.dst)
    return pack_message(RTM_DELNEIGH, NLM_F_REQUEST | NLM_F_ACK, seq, payload)


# --- parsing ---------------------------------------------------------------------------------------


def parse_messages(data: bytes) -> Iterator[NetlinkMessage]:
    """Split one datagram into its netlink messages."""
    offset = 0
    while offset + NLMSG_HDR.size <= len(data):
        length, msg_type, flags, seq, pid = NLMSG_HDR.unpack_from(data, offset)
        if length < NLMSG_HDR.size or offset + length > len(data):
            raise NetlinkError(errno.EBADMSG, f"truncated netlink message ({length} bytes at offset {offset})")
        yield NetlinkMessage(msg_type, flags, seq, pid, bytes(data[offset + NLMSG_HDR.size : offset + length]))
        offset += align4(length)
    if offset < len(data) and any(data[offset:]):
        raise NetlinkError(errno.EBADMSG, f"{len(data) - offset} trailing bytes after the last netlink message")


def parse_attrs(data: bytes) -> dict[int, bytes]:
    attrs: dict[int, bytes] = {}
    offset = 0
    while offset + RTATTR.size <= len(data):
        length, attr_type = RTATTR.unpack_from(data, offset)
        if length < RTATTR.size or offset + length > len(data):
            raise NetlinkError(errno.EBADMSG, f"truncated attribute ({length} bytes at offset {offset})")
        attrs.setdefault(attr_type & NLA_TYPE_MASK, bytes(data[offset + RTATTR.size : offset + length]))
        offset += align4(length)
    return attrs


def parse_neighbour(payload: bytes) -> Neighbour:
    """Decode the payload of an ``RTM_NEWNEIGH`` message."""
    if len(payload) < NDMSG.size:
        raise NetlinkError(errno.EBADMSG, f"neighbour message of {len(payload)} bytes is too short")
    family, _pad1, _pad2, ifindex, state, flags, ntype = NDMSG.unpack_from(payload)
    attrs = parse_attrs(payload[NDMSG.size :])
    return Neighbour(family, ifindex, state, flags, ntype, attrs.get(NDA_DST), attrs.get(NDA_LLADDR))


def parse_errno(payload: bytes) -> int:
    """The positive errno of an ``NLMSG_ERROR`` (or ``NLMSG_DONE``) payload; 0 for an ack."""
    if len(payload) < NLMSG_ERRNO.size:
        return 0
    (value,) = NLMSG_ERRNO.unpack_from(payload)
    return -int(value) if value < 0 else 0


def should_flush(neighbour: Neighbour) -> bool:
    """True for a dynamic IPv4/IPv6 entry (what ``ip neigh flush all`` removes)."""
    return (
        neighbour.family in (socket.AF_INET, socket.AF_INET6)
        and neighbour.dst is not None
        and neighbour.ifindex > 0
        and not neighbour.state & (NUD_PERMANENT | NUD_NOARP)
        and not neighbour.flags & NTF_PROXY
    )


# --- talking to the kernel -------------------------------------------------------------------------


class NetlinkSocket(Protocol):
    def send(self, data: bytes) -> None: ...

    def recv(self) -> bytes: ...

    def close(self) -> None: ...


class RouteSocket:
    """A bound ``NETLINK_ROUTE`` socket that talks to the kernel (port 0)."""

    def __init__(self, timeout: float = SOCKET_TIMEOUT) -> None:
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.NETLINK_ROUTE)
        try:
            self._sock.settimeout(timeout)
            self._sock.bind((0, 0))
        except BaseException:
            self._sock.close()
            raise

    def send(self, data: bytes) -> None:
        self._sock.sendto(data, (0, 0))

    def recv(self) -> bytes:
        return self._sock.recv(RECV_SIZE)

    def close(self) -> None:
        self._sock.close()


def _raise_errno(code: int, what: str) -> None:
    raise NetlinkError(code, f"{what}: {os.strerror(code)}")


def dump_neighbours(sock: NetlinkSocket, seq: int) -> list[Neighbour]:
    """Every entry of the neighbour table (read-only). Reads the multipart reply up to ``NLMSG_DONE``."""
    sock.send(pack_getneigh_dump(seq))
    entries: list[Neighbour] = []
    while True:
        data = sock.recv()
        if not data:
            raise NetlinkError(errno.EIO, "netlink socket closed during the neighbour dump")
        for msg in parse_messages(data):
            if msg.seq != seq:
                continue  # a stray reply to something else
            if msg.type == NLMSG_DONE:
                code = parse_errno(msg.payload)
                if code:
                    _raise_errno(code, "neighbour dump failed")
                return entries
            if msg.type == NLMSG_ERROR:
                code = parse_errno(msg.payload)
                if code:
                    _raise_errno(code, "neighbour dump failed")
            elif msg.type == NLMSG_OVERRUN:
                raise NetlinkError(errno.ENOBUFS, "netlink overrun during the neighbour dump")
            elif msg.type == RTM_NEWNEIGH:
                entries.append(parse_neighbour(msg.payload))


def delete_neighbour(sock: NetlinkSocket, neighbour: Neighbour, seq: int) -> bool:
    """Delete one entry and wait for the ack. False if it was already gone (``ENOENT``)."""
    sock.send(pack_delneigh(seq, neighbour))
    while True:
        data = sock.recv()
        if not data:
            raise NetlinkError(errno.EIO, "netlink socket closed while deleting a neighbour")
        for msg in parse_messages(data):
            if msg.seq != seq or msg.type != NLMSG_ERROR:
                continue
            code = parse_errno(msg.payload)
            if code == 0:
                return True
            if code == errno.ENOENT:
                return False
            _raise_errno(code, f"cannot delete neighbour {neighbour.ip} on ifindex {neighbour.ifindex}")


def flush_neighbours(open_socket: Callable[[], NetlinkSocket] = RouteSocket) -> int:
    """Flush every dynamic neighbour entry; return how many were removed. Needs CAP_NET_ADMIN."""
    with contextlib.closing(open_socket()) as sock:
        entries = [n for n in dump_neighbours(sock, seq=1) if should_flush(n)]
        removed = 0
        for seq, neighbour in enumerate(entries, start=2):
            if delete_neighbour(sock, neighbour, seq):
                removed += 1
    return removed
