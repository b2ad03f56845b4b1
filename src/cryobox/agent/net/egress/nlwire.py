"""Netlink's wire format as the egress gate's two kernel interfaces speak it (:mod:`.nfqueue`, :mod:`.conntrack`):
message framing and attributes (TLVs, 4-byte aligned). Headers are in host byte order; what the attributes carry
is each subsystem's business (netfilter's numbers are big-endian)."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import TypeVar

NLA_F_NESTED = 0x8000
NLA_TYPE_MASK = 0x3FFF  # without NLA_F_NESTED / NLA_F_NET_BYTEORDER
NLMSG = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, seq, port id
NLATTR = struct.Struct("=HH")  # nlattr: length, type

Buffer = TypeVar("Buffer", bytes, memoryview)


def attr(kind: int, payload: bytes, *, nested: bool = False) -> bytes:
    """One attribute, padded to 4 bytes."""
    size = NLATTR.size + len(payload)
    return NLATTR.pack(size, kind | (NLA_F_NESTED if nested else 0)) + payload + bytes(-size % 4)


def attrs(data: Buffer) -> dict[int, Buffer]:
    """The attributes in ``data`` by type (flags masked off); a malformed tail is ignored."""
    found: dict[int, Buffer] = {}
    pos = 0
    while pos + NLATTR.size <= len(data):
        size, kind = NLATTR.unpack_from(data, pos)
        if size < NLATTR.size or pos + size > len(data):
            break
        found[kind & NLA_TYPE_MASK] = data[pos + NLATTR.size : pos + size]
        pos += (size + 3) & ~3
    return found


def messages(data: Buffer) -> Iterator[tuple[int, int, Buffer]]:
    """(type, sequence number, what follows the nlmsghdr) of every message in one datagram."""
    pos = 0
    while pos + NLMSG.size <= len(data):
        size, kind, _flags, seq, _port = NLMSG.unpack_from(data, pos)
        if size < NLMSG.size or pos + size > len(data):
            return
        yield kind, seq, data[pos + NLMSG.size : pos + size]
        pos += (size + 3) & ~3


__all__ = ["NLATTR", "NLA_F_NESTED", "NLA_TYPE_MASK", "NLMSG", "attr", "attrs", "messages"]
