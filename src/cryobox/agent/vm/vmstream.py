"""Split a QEMU 7.x migration stream into a sparse raw RAM image and a device-only vmstate.

A snapshot of a *restored* sandbox is taken with QEMU's ``background-snapshot`` (the guest pauses only while
its device state is saved; RAM is streamed while it runs). That stream carries every page of the guest RAM.
Splitting it gives the same shape as a baked template: ``memory`` (the RAM block's pages written at their
offsets; zero pages stay holes) and ``vmstate`` (the stream with the RAM block's page records removed, which
QEMU loads with ``x-ignore-shared`` over a ``share=off`` mapping of ``memory``).

Only the framing needed for that is parsed (``migration/savevm.c``, ``migration/ram.c``):

- everything before the ``ram`` section's START (file header, configuration section) is copied verbatim;
- ``ram`` START/PART/END sections: records of ``main_block`` are moved to the image, every other block's
  records (ROMs, small firmware blobs) are kept, re-emitted with their block name;
- everything after the last ``ram`` PART/END section (the device sections, EOF marker, vmdesc) is copied
  verbatim. (A background snapshot writes no END section: its buffered device state follows the last PART.)
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import BinaryIO, Protocol

from ...errors import VmmError

PAGE_SIZE = 4096
PAGE_MASK = ~(PAGE_SIZE - 1) & 0xFFFFFFFFFFFFFFFF

SECTION_START = 0x01
SECTION_PART = 0x02
SECTION_END = 0x03
SECTION_FULL = 0x04
SECTION_FOOTER = 0x7E

FLAG_ZERO = 0x02
FLAG_MEM_SIZE = 0x04
FLAG_PAGE = 0x08
FLAG_EOS = 0x10
FLAG_CONTINUE = 0x20
FLAG_UNSUPPORTED = 0x01 | 0x40 | 0x80 | 0x100  # FULL, XBZRLE, HOOK, COMPRESS_PAGE: never enabled by us

# SECTION_START, be32 section id, "ram" (len-prefixed), be32 instance 0, be32 version 4
RAM_START = re.compile(rb"\x01(....)\x03ram\x00\x00\x00\x00\x00\x00\x00\x04", re.DOTALL)


@dataclass
class SplitStats:
    pages: int = 0
    zero_pages: int = 0
    kept_records: int = 0
    stream_bytes: int = 0
    vmstate_bytes: int = 0
    blocks: dict[str, int] = field(default_factory=dict)


class PageSink(Protocol):
    """Receives the RAM block's pages: ``page`` for data, ``zero`` for a zero page (both at byte ``addr``)."""

    def page(self, addr: int, data: memoryview) -> None: ...

    def zero(self, addr: int) -> None: ...

    def refilled(self) -> None:
        """More of the stream was read: every record buffered now was sent before this call (a sink that
        caches facts about the source's memory must not use ones older than this for them)."""


class _FileSink:
    """Pages written at their offsets into a file already sized to the RAM (zero pages stay holes)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def page(self, addr: int, data: memoryview) -> None:
        os.pwrite(self.fd, data, addr)

    def zero(self, addr: int) -> None:
        pass

    def refilled(self) -> None:
        pass


class _Reader:
    """Buffered big-endian reads over a binary stream; EOF in the middle of a field is a corrupt stream."""

    def __init__(self, src: BinaryIO, chunk: int = 8 << 20, on_fill: Callable[[], None] | None = None) -> None:
        self.src = src
        self.on_fill = on_fill
        self.chunk = chunk
        self.buf = b""
        self.pos = 0
        self.consumed = 0

    def _fill(self, n: int, strict: bool = True) -> None:
        """Buffer at least ``n`` bytes ahead; at the end of the stream that is corrupt if ``strict``, else fine
        (then fewer are buffered)."""
        while len(self.buf) - self.pos < n:
            more = self.src.read(max(self.chunk, n))
            if not more:
                if not strict:
                    return
                raise VmmError(f"migration stream truncated at byte {self.consumed + len(self.buf)}")
            self.buf = self.buf[self.pos :] + more
            self.consumed += self.pos
            self.pos = 0
            if self.on_fill is not None:
                self.on_fill()

    def read(self, n: int) -> bytes:
        self._fill(n)
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def view(self, n: int) -> memoryview:
        self._fill(n)
        out = memoryview(self.buf)[self.pos : self.pos + n]
        self.pos += n
        return out

    def u8(self) -> int:
        self._fill(1)
        value = self.buf[self.pos]
        self.pos += 1
        return value

    def be32(self) -> int:
        return int(struct.unpack(">I", self.read(4))[0])

    def be64(self) -> int:
        return int(struct.unpack(">Q", self.read(8))[0])

    def idstr(self) -> bytes:
        return self.read(self.u8())

    def rest(self) -> bytes:
        out = self.buf[self.pos :]
        self.consumed += len(self.buf)
        self.buf, self.pos = b"", 0
        return out


def _footer(r: _Reader, section_id: int, out: bytearray) -> None:
    marker = r.u8()
    if marker != SECTION_FOOTER or r.be32() != section_id:
        raise VmmError(f"migration stream: bad footer for section {section_id}")
    out += struct.pack(">BI", SECTION_FOOTER, section_id)


def _ram_records(r: _Reader, main: bytes, sink: PageSink, stats: SplitStats, out: bytearray, block: bytes) -> bytes:
    """Copy one RAM section's records up to EOS: ``main`` pages to the image, the rest to ``out``.

    ``block`` is the last block named in the stream (a CONTINUE record refers to it, across sections too);
    the block named last is returned."""
    while True:
        header = r.be64()
        flags, addr = header & ~PAGE_MASK, header & PAGE_MASK
        if flags & FLAG_EOS:
            out += struct.pack(">Q", FLAG_EOS)
            return block
        if flags & FLAG_UNSUPPORTED or not flags & (FLAG_ZERO | FLAG_PAGE):
            raise VmmError(f"migration stream: unsupported RAM record flags {flags:#x}")
        if not flags & FLAG_CONTINUE:
            block = r.idstr()
        if not block:
            raise VmmError("migration stream: RAM record continues a block that was never named")
        if flags & FLAG_ZERO:
            fill = r.u8()
            if block == main and fill == 0:
                stats.zero_pages += 1
                sink.zero(addr)
                continue
            payload = bytes([fill])
        else:
            if block == main:
                page = r.view(PAGE_SIZE)
                if addr + PAGE_SIZE > stats.blocks.get(main.decode(), 0):
                    raise VmmError(f"migration stream: page at {addr:#x} is outside the RAM block")
                sink.page(addr, page)
                stats.pages += 1
                continue
            payload = r.read(PAGE_SIZE)
        stats.kept_records += 1
        out += struct.pack(">QB", header & ~FLAG_CONTINUE, len(block)) + block + payload


def _ram_setup(r: _Reader, out: bytearray, stats: SplitStats) -> None:
    """The START section body: total size, then (idstr, used length, GPA) per block, then EOS."""
    header = r.be64()
    if not header & FLAG_MEM_SIZE:
        raise VmmError("migration stream: RAM section does not start with the block list")
    out += struct.pack(">Q", header)
    total, remaining = header & PAGE_MASK, header & PAGE_MASK
    while remaining > 0:
        name = r.idstr()
        length = r.be64()
        addr = r.be64()  # present because x-ignore-shared is on for every snapshot we take
        stats.blocks[name.decode(errors="replace")] = length
        out += struct.pack(">B", len(name)) + name + struct.pack(">QQ", length, addr)
        remaining -= length
    if remaining != 0:
        raise VmmError(f"migration stream: RAM block sizes do not add up to {total}")
    if r.be64() != FLAG_EOS:
        raise VmmError("migration stream: RAM block list not followed by EOS")
    out += struct.pack(">Q", FLAG_EOS)


def split_stream(src: BinaryIO, vmstate: BinaryIO, memory: int | PageSink, main_block: str = "ram") -> SplitStats:
    """Read a migration stream from ``src``; hand RAM pages of ``main_block`` to ``memory`` (a sink, or a file
    already truncated to the RAM size, so zero pages stay holes) and everything else to ``vmstate``.

    :raises VmmError: the stream is not a QEMU 7.x precopy/background-snapshot stream we understand.
    """
    stats = SplitStats()
    sink = _FileSink(memory) if isinstance(memory, int) else memory
    main = main_block.encode()
    r = _Reader(src, on_fill=sink.refilled)
    head = r.read(4)
    if head != b"QEVM":
        raise VmmError("migration stream: bad magic")
    r.pos = 0
    r._fill(1 << 16, strict=False)  # the search window (a shorter stream is searched whole)
    match = RAM_START.search(r.buf, 0, min(len(r.buf), 1 << 16))
    if match is None:
        raise VmmError("migration stream: no RAM section found")
    prefix = r.read(match.start())
    ram_id = int(struct.unpack(">I", match.group(1))[0])
    out = bytearray(prefix)
    out += r.read(match.end() - match.start())
    _ram_setup(r, out, stats)
    _footer(r, ram_id, out)
    block = b""
    while True:
        kind = r.u8()
        if kind not in (SECTION_PART, SECTION_END):
            # background-snapshot appends the buffered device state right after the last PART (no END)
            r.pos -= 1
            break
        section_id = r.be32()
        if section_id != ram_id:
            raise VmmError(f"migration stream: iterable section {section_id} is not RAM; not supported")
        out += struct.pack(">BI", kind, section_id)
        block = _ram_records(r, main, sink, stats, out, block)
        _footer(r, ram_id, out)
        if len(out) > 1 << 20:
            vmstate.write(out)
            stats.vmstate_bytes += len(out)
            out.clear()
        if kind == SECTION_END:
            break
    out += r.rest()
    tail = 0
    while more := src.read(1 << 20):
        out += more
        tail += len(more)
    vmstate.write(out)
    stats.vmstate_bytes += len(out)
    stats.stream_bytes = r.consumed + tail
    return stats


QEMU_VM_FILE_HEADER = b"QEVM\x00\x00\x00\x03"
SECTION_CONFIGURATION = 0x07
SECTION_SUBSECTION = 0x05
EMPTY_VMDESC = b"\x06" + struct.pack(">I", 2) + b"{}"  # QEMU_VM_VMDESCRIPTION, be32 length, JSON
CAPABILITIES_SUBSECTION = b"configuration/capabilities"


def config_prefix(head: bytes) -> bytes:
    """The file header and configuration section at the start of a migration stream (``head``: its first bytes).

    The configuration (``migration/savevm.c``, ``vmstate_configuration``): the machine type, then a
    ``configuration/capabilities`` subsection listing the capabilities both ends must agree on
    (``x-ignore-shared``). A device-state file (``xen-save-devices-state``) has neither; prepending this prefix of
    a stream the same QEMU wrote for the same machine makes it loadable (:func:`devices_vmstate`).

    :raises VmmError: ``head`` does not start like a QEMU 7+ migration stream with a configuration section.
    """
    r = _Cursor(head)
    try:
        if r.take(8) != QEMU_VM_FILE_HEADER or r.byte() != SECTION_CONFIGURATION:
            raise VmmError("the stream has no configuration section")
        r.take(r.be32())  # machine type
        while r.peek() == SECTION_SUBSECTION:
            r.byte()
            name = r.take(r.byte())
            if name != CAPABILITIES_SUBSECTION:
                raise VmmError(f"unknown configuration subsection {name!r}")
            r.be32()  # version
            for _ in range(r.be32()):
                r.take(r.byte())
        if r.peek() not in (SECTION_START, SECTION_FULL):
            raise VmmError("the configuration section is not followed by a section")
    except IndexError as err:
        raise VmmError("the stream ends inside its configuration section") from err
    return head[: r.pos]


def devices_vmstate(prefix: bytes, devices: bytes) -> bytes:
    """A loadable vmstate from a device-state file: ``prefix`` (:func:`config_prefix`) + its sections."""
    if not devices.startswith(QEMU_VM_FILE_HEADER) or len(devices) < 9 or devices[8] != SECTION_FULL:
        raise VmmError("the device state file does not start with a device section")
    if devices[-1] != 0:  # QEMU_VM_EOF
        raise VmmError("the device state file does not end with QEMU's EOF marker")
    # after the file's EOF byte, an empty vmdesc (what a migration sends last): the loader reads it and stays
    # quiet instead of logging "Expected vmdescription section" into every restored sandbox's qemu.log
    return prefix + devices[len(QEMU_VM_FILE_HEADER) :] + EMPTY_VMDESC


class _Cursor:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise IndexError(n)
        self.pos += n
        return self.data[self.pos - n : self.pos]

    def byte(self) -> int:
        return self.take(1)[0]

    def peek(self) -> int:
        return self.data[self.pos]

    def be32(self) -> int:
        return int(struct.unpack(">I", self.take(4))[0])
