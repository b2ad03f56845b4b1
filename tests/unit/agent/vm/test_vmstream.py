"""split_stream on synthetic QEMU 7.x migration streams built with the framing of ``migration/savevm.c`` and
``migration/ram.c`` (the subset ``vmstream`` parses)."""

from __future__ import annotations

import io
import os
import random
import struct
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from cryobox.agent.vm.vmstream import (
    FLAG_CONTINUE,
    FLAG_EOS,
    FLAG_MEM_SIZE,
    FLAG_PAGE,
    FLAG_ZERO,
    PAGE_SIZE,
    SECTION_END,
    SECTION_FOOTER,
    SECTION_PART,
    SECTION_START,
    SplitStats,
    split_stream,
)
from cryobox.errors import VmmError

RAM_ID = 2
RAM_SIZE = 64 * PAGE_SIZE
BLOCKS: list[tuple[bytes, int, int]] = [  # (idstr, used length, GPA)
    (b"ram", RAM_SIZE, 0),
    (b"pc.bios", 16 * PAGE_SIZE, 0xFFFF0000),
    (b"/rom@etc/acpi/tables", PAGE_SIZE, 0),
]
# file header, then a configuration section (QEMU_VM_CONFIGURATION, machine name, capabilities): copied verbatim
PREFIX = (
    b"QEVM"
    + struct.pack(">I", 3)
    + b"\x07"
    + struct.pack(">I", 7)
    + b"microvm"
    + b"\x05\x1aconfiguration/capabilities"
    + struct.pack(">II", 1, 1)
    + b"\x0fx-ignore-shared"
)
# what background-snapshot writes after the last PART: the buffered device state (FULL sections), EOF, vmdesc
TAIL = b"\x04" + struct.pack(">I", 3) + b"\x06timer\x00" + b"...device state..." + b"\x00" + b"\x06{vmdesc}"


def be32(value: int) -> bytes:
    return struct.pack(">I", value)


def be64(value: int) -> bytes:
    return struct.pack(">Q", value)


def footer(section_id: int = RAM_ID) -> bytes:
    return bytes([SECTION_FOOTER]) + be32(section_id)


def page(seed: int) -> bytes:
    return bytes([seed & 0xFF]) * (PAGE_SIZE - 8) + be64(seed)


@dataclass(frozen=True)
class Rec:
    """One RAM record: ``data`` is a 4 KiB page, or None for a ZERO record with ``fill``."""

    block: bytes
    addr: int
    data: bytes | None = None
    fill: int = 0

    def encode(self, cont: bool) -> bytes:
        flags = (FLAG_PAGE if self.data is not None else FLAG_ZERO) | (FLAG_CONTINUE if cont else 0)
        out = be64(self.addr | flags)
        if not cont:
            out += bytes([len(self.block)]) + self.block
        return out + (self.data if self.data is not None else bytes([self.fill]))


def ram_start(blocks: Sequence[tuple[bytes, int, int]] = BLOCKS, total: int | None = None) -> bytes:
    total = sum(length for _, length, _ in blocks) if total is None else total
    out = bytes([SECTION_START]) + be32(RAM_ID) + b"\x03ram" + be32(0) + be32(4)
    out += be64(total | FLAG_MEM_SIZE)
    for name, length, gpa in blocks:
        out += bytes([len(name)]) + name + be64(length) + be64(gpa)
    return out + be64(FLAG_EOS) + footer()


def stream(
    sections: Sequence[Sequence[Rec]],
    *,
    use_continue: bool = True,
    end: bool = False,
    tail: bytes = TAIL,
    blocks: Sequence[tuple[bytes, int, int]] = BLOCKS,
) -> bytes:
    """A whole stream. With ``use_continue``, a record of the block named last (in this or an earlier section,
    as QEMU does) carries CONTINUE instead of the name. With ``end``, the last section is an END section."""
    out = PREFIX + ram_start(blocks)
    last = b""
    for i, records in enumerate(sections):
        kind = SECTION_END if end and i == len(sections) - 1 else SECTION_PART
        out += bytes([kind]) + be32(RAM_ID)
        for rec in records:
            out += rec.encode(cont=use_continue and rec.block == last)
            last = rec.block
        out += be64(FLAG_EOS) + footer()
    return out + tail


def expected_vmstate(sections: Sequence[Sequence[Rec]], *, end: bool = False, tail: bytes = TAIL) -> bytes:
    """The stream without ``ram`` records; every kept record names its block."""
    kept = [[rec for rec in records if rec.block != b"ram"] for records in sections]
    return stream(kept, use_continue=False, end=end, tail=tail)


@dataclass
class Split:
    stats: SplitStats
    vmstate: bytes
    memory: Path


def split(data: bytes, tmp_path: Path, size: int = RAM_SIZE, src: io.BytesIO | None = None) -> Split:
    memory = tmp_path / "memory"
    fd = os.open(memory, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.ftruncate(fd, size)
        out = io.BytesIO()
        stats = split_stream(io.BytesIO(data) if src is None else src, out, fd)
    finally:
        os.close(fd)
    return Split(stats, out.getvalue(), memory)


class Dribble(io.BytesIO):
    """A source that returns at most ``n`` bytes per read (forces many refills of the reader's buffer)."""

    def __init__(self, data: bytes, n: int) -> None:
        super().__init__(data)
        self.n = n

    def read(self, size: int | None = -1, /) -> bytes:
        return super().read(self.n if size is None or size < 0 else min(size, self.n))


# -- the happy path ----------------------------------------------------------------------------------------------


def test_splits_pages_zero_pages_and_foreign_blocks(tmp_path: Path) -> None:
    sections = [
        [
            Rec(b"ram", 0, page(1)),
            Rec(b"ram", PAGE_SIZE, None),  # zero page: a hole
            Rec(b"ram", 5 * PAGE_SIZE, page(5)),
            Rec(b"pc.bios", 0, page(100)),
            Rec(b"pc.bios", PAGE_SIZE, None, fill=0),
            Rec(b"ram", 63 * PAGE_SIZE, page(63)),
        ],
        [
            Rec(b"/rom@etc/acpi/tables", 0, page(200)),
            Rec(b"ram", 7 * PAGE_SIZE, None),
        ],
    ]
    result = split(stream(sections), tmp_path)

    assert result.vmstate == expected_vmstate(sections)
    assert result.stats.pages == 3
    assert result.stats.zero_pages == 2
    assert result.stats.kept_records == 3
    assert result.stats.blocks == {"ram": RAM_SIZE, "pc.bios": 16 * PAGE_SIZE, "/rom@etc/acpi/tables": PAGE_SIZE}
    assert result.stats.stream_bytes == len(stream(sections))
    assert result.stats.vmstate_bytes == len(result.vmstate)

    memory = result.memory.read_bytes()
    assert len(memory) == RAM_SIZE
    written = {0: page(1), 5: page(5), 63: page(63)}
    for n in range(RAM_SIZE // PAGE_SIZE):
        chunk = memory[n * PAGE_SIZE : (n + 1) * PAGE_SIZE]
        assert chunk == written.get(n, bytes(PAGE_SIZE)), f"page {n}"


def test_kept_records_name_their_block_and_drop_continue(tmp_path: Path) -> None:
    sections = [[Rec(b"pc.bios", 0, page(1)), Rec(b"pc.bios", PAGE_SIZE, page(2)), Rec(b"pc.bios", 2 * PAGE_SIZE)]]
    data = stream(sections)
    assert data.count(b"\x07pc.bios") == 2  # once in the block list, once in the first record: the rest CONTINUE
    result = split(data, tmp_path)
    assert result.vmstate == expected_vmstate(sections)
    assert result.vmstate.count(b"\x07pc.bios") == 4
    records = result.vmstate[len(PREFIX + ram_start()) + 5 :]
    header = struct.unpack(">Q", records[:8])[0]
    assert header == FLAG_PAGE  # CONTINUE cleared, address 0
    assert result.stats.kept_records == 3 and result.stats.pages == 0


def test_continue_refers_to_block_named_in_a_previous_section(tmp_path: Path) -> None:
    """QEMU's ``last_sent_block`` survives section boundaries: a PART may open with CONTINUE records."""
    sections = [
        [Rec(b"ram", 0, page(1))],
        [Rec(b"ram", 2 * PAGE_SIZE, page(2)), Rec(b"pc.bios", 0, page(3))],
        [Rec(b"pc.bios", PAGE_SIZE, page(4)), Rec(b"ram", 3 * PAGE_SIZE, page(5))],
    ]
    data = stream(sections)
    # the second and third sections start with a CONTINUE record
    part2 = bytes([SECTION_PART]) + be32(RAM_ID) + be64(2 * PAGE_SIZE | FLAG_PAGE | FLAG_CONTINUE)
    part3 = bytes([SECTION_PART]) + be32(RAM_ID) + be64(PAGE_SIZE | FLAG_PAGE | FLAG_CONTINUE)
    assert part2 in data and part3 in data

    result = split(data, tmp_path)
    memory = result.memory.read_bytes()
    assert memory[2 * PAGE_SIZE : 3 * PAGE_SIZE] == page(2)
    assert memory[3 * PAGE_SIZE : 4 * PAGE_SIZE] == page(5)
    assert result.vmstate == expected_vmstate(sections)
    assert page(2) not in result.vmstate and page(4) in result.vmstate
    assert result.stats.pages == 3 and result.stats.kept_records == 2


def test_end_section_then_device_state(tmp_path: Path) -> None:
    """A plain (stopped) migration closes RAM with an END section before the device sections."""
    sections = [[Rec(b"ram", 0, page(1))], [Rec(b"ram", PAGE_SIZE, page(2)), Rec(b"pc.bios", 0)]]
    data = stream(sections, end=True)
    assert bytes([SECTION_END]) + be32(RAM_ID) in data
    result = split(data, tmp_path)
    assert result.vmstate == expected_vmstate(sections, end=True)
    assert result.vmstate.endswith(TAIL)
    assert result.stats.pages == 2 and result.stats.kept_records == 1


def test_end_section_stops_parsing_even_if_tail_starts_like_a_section(tmp_path: Path) -> None:
    tail = bytes([SECTION_PART]) + b"not a ram section at all"
    sections = [[Rec(b"ram", 0, page(1))]]
    result = split(stream(sections, end=True, tail=tail), tmp_path)
    assert result.vmstate == expected_vmstate(sections, end=True, tail=tail)


def test_tail_is_copied_verbatim(tmp_path: Path) -> None:
    tail = b"\x04" + bytes(range(256)) * 40 + b"\x00"  # binary, and bigger than a page
    sections = [[Rec(b"ram", 0, page(9))]]
    result = split(stream(sections, tail=tail), tmp_path)
    assert result.vmstate.endswith(tail)
    assert result.vmstate == expected_vmstate(sections, tail=tail)


def test_no_ram_sections_at_all(tmp_path: Path) -> None:
    data = stream([])
    result = split(data, tmp_path)
    assert result.vmstate == data
    assert result.stats.pages == result.stats.zero_pages == result.stats.kept_records == 0
    assert result.memory.read_bytes() == bytes(RAM_SIZE)


def test_a_short_stream_is_fine(tmp_path: Path) -> None:
    """Zero pages only: the whole stream is far smaller than the reader's 4 KiB look-ahead."""
    sections = [[Rec(b"ram", 0), Rec(b"ram", PAGE_SIZE)]]
    data = stream(sections, tail=b"\x00")
    assert len(data) < 512
    result = split(data, tmp_path)
    assert result.stats.zero_pages == 2
    assert result.vmstate == expected_vmstate(sections, tail=b"\x00")


def test_big_sparse_image_keeps_its_holes(tmp_path: Path) -> None:
    size = 256 << 20
    blocks = [(b"ram", size, 0), (b"pc.bios", PAGE_SIZE, 0xFFFFF000)]
    far = size - PAGE_SIZE
    sections = [
        [Rec(b"ram", 0, page(1)), Rec(b"ram", far, page(2))],
        [Rec(b"ram", n * PAGE_SIZE) for n in range(1, 2048)],  # 8 MiB of zero pages: not written
    ]
    data = stream(sections, blocks=blocks)
    result = split(data, tmp_path, size=size)
    st = result.memory.stat()
    assert st.st_size == size
    assert st.st_blocks * 512 < 1 << 20, f"{st.st_blocks} blocks allocated"
    assert result.stats.zero_pages == 2047 and result.stats.pages == 2
    with result.memory.open("rb") as f:
        assert f.read(PAGE_SIZE) == page(1)
        f.seek(far)
        assert f.read() == page(2)


def test_refills_across_record_boundaries(tmp_path: Path) -> None:
    """Every field may straddle the reader's buffer boundary; the tail beyond the buffer still counts."""
    sections = [
        [Rec(b"ram", n * PAGE_SIZE, page(n)) for n in range(8)] + [Rec(b"pc.bios", 0, page(50))],
        [Rec(b"pc.bios", PAGE_SIZE, page(51)), Rec(b"ram", 9 * PAGE_SIZE)],
    ]
    tail = b"\x04" + os.urandom(3 << 20) + b"\x00"  # longer than the 1 MiB reads of the verbatim copy
    data = stream(sections, tail=tail)
    for n in (997, 4093, 1 << 16):
        result = split(data, tmp_path, src=Dribble(data, n))
        assert result.vmstate == expected_vmstate(sections, tail=tail), n
        assert result.stats.stream_bytes == len(data), n
        memory = result.memory.read_bytes()
        assert all(memory[k * PAGE_SIZE : (k + 1) * PAGE_SIZE] == page(k) for k in range(8)), n


# -- round trip property -----------------------------------------------------------------------------------------


def random_sections(rng: random.Random, with_ram: bool) -> list[list[Rec]]:
    """Up to 4 sections of random records; each page is sent at most once (as in a background snapshot or a
    migration of a stopped VM, the only streams we split)."""
    unsent = {name: list(range(0, length, PAGE_SIZE)) for name, length, _ in BLOCKS if with_ram or name != b"ram"}
    for addrs in unsent.values():
        rng.shuffle(addrs)
    sections = []
    for _ in range(rng.randrange(0, 5)):
        records = []
        for _ in range(rng.randrange(0, 12)):
            candidates = [name for name, addrs in unsent.items() if addrs]
            if not candidates:
                break
            name = rng.choice(candidates)
            addr = unsent[name].pop()
            if rng.random() < 0.5:
                records.append(Rec(name, addr, page(rng.randrange(1 << 32))))
            else:
                records.append(Rec(name, addr, None, fill=rng.choice([0, 0, 0xFF]) if name != b"ram" else 0))
        sections.append(records)
    return sections


@pytest.mark.parametrize("seed", range(40))
def test_round_trip_without_ram_pages(seed: int, tmp_path: Path) -> None:
    """Without ``ram`` records and without CONTINUE, the vmstate is the input byte for byte."""
    rng = random.Random(seed)
    sections = random_sections(rng, with_ram=False)
    end = rng.random() < 0.5
    data = stream(sections, use_continue=False, end=end)
    result = split(data, tmp_path)
    assert result.vmstate == data
    assert result.stats.kept_records == sum(len(records) for records in sections)
    assert result.memory.read_bytes() == bytes(RAM_SIZE)


@pytest.mark.parametrize("seed", range(40))
def test_round_trip_drops_exactly_the_ram_records(seed: int, tmp_path: Path) -> None:
    rng = random.Random(seed)
    sections = random_sections(rng, with_ram=True)
    end = rng.random() < 0.5
    result = split(stream(sections, use_continue=True, end=end), tmp_path)
    assert result.vmstate == expected_vmstate(sections, end=end)

    image = bytearray(RAM_SIZE)
    pages = zero = 0
    for rec in (rec for records in sections for rec in records if rec.block == b"ram"):
        if rec.data is not None:
            image[rec.addr : rec.addr + PAGE_SIZE] = rec.data
            pages += 1
        else:
            image[rec.addr : rec.addr + PAGE_SIZE] = bytes(PAGE_SIZE)
            zero += 1
    assert result.memory.read_bytes() == bytes(image)
    assert (result.stats.pages, result.stats.zero_pages) == (pages, zero)
    assert result.stats.kept_records == sum(rec.block != b"ram" for records in sections for rec in records)


# -- corrupt or unsupported streams ------------------------------------------------------------------------------


def test_bad_magic(tmp_path: Path) -> None:
    with pytest.raises(VmmError, match="bad magic"):
        split(b"QEVX" + stream([])[4:], tmp_path)


def test_no_ram_section(tmp_path: Path) -> None:
    with pytest.raises(VmmError, match="no RAM section"):
        split(PREFIX + TAIL, tmp_path)


@pytest.mark.parametrize("cut", [-len(TAIL) - 1, -len(TAIL) - 5, -len(TAIL) - 9, -len(TAIL) - 100])
def test_truncated_stream(cut: int, tmp_path: Path) -> None:
    """Cut inside the last RAM section (its footer, its EOS, a page): the stream ends mid-field."""
    data = stream([[Rec(b"ram", 0, page(1))]])[:cut]
    with pytest.raises(VmmError, match=f"truncated at byte {len(data)}"):
        split(data, tmp_path)


def test_truncated_in_block_list(tmp_path: Path) -> None:
    data = PREFIX + ram_start()
    with pytest.raises(VmmError, match="truncated"):
        split(data[: len(PREFIX) + 40], tmp_path)


def test_stream_ending_right_after_a_part_section(tmp_path: Path) -> None:
    with pytest.raises(VmmError, match="truncated"):
        split(stream([[Rec(b"ram", 0, page(1))]], tail=b""), tmp_path)


@pytest.mark.parametrize("flag", [0x01, 0x40, 0x80, 0x100])
def test_unsupported_record_flags(flag: int, tmp_path: Path) -> None:
    """FULL, XBZRLE, HOOK, COMPRESS_PAGE are never enabled by us."""
    bad = be64(flag | FLAG_PAGE) + b"\x03ram" + page(1)
    data = PREFIX + ram_start() + bytes([SECTION_PART]) + be32(RAM_ID) + bad + be64(FLAG_EOS) + footer() + TAIL
    with pytest.raises(VmmError, match=f"unsupported RAM record flags {flag | FLAG_PAGE:#x}"):
        split(data, tmp_path)


def test_record_that_is_neither_page_nor_zero(tmp_path: Path) -> None:
    data = PREFIX + ram_start() + bytes([SECTION_PART]) + be32(RAM_ID) + be64(FLAG_MEM_SIZE) + footer() + TAIL
    with pytest.raises(VmmError, match="unsupported RAM record flags 0x4"):
        split(data, tmp_path)


def test_block_sizes_do_not_add_up(tmp_path: Path) -> None:
    total = sum(length for _, length, _ in BLOCKS) - 2 * PAGE_SIZE  # pc.bios overshoots the announced total
    data = PREFIX + ram_start(total=total) + TAIL
    with pytest.raises(VmmError, match=f"do not add up to {total}"):
        split(data, tmp_path)


def test_block_sizes_falling_short_are_an_error_too(tmp_path: Path) -> None:
    total = sum(length for _, length, _ in BLOCKS) + PAGE_SIZE  # the EOS is then misread as another block
    data = PREFIX + ram_start(total=total) + stream([[Rec(b"ram", 0, page(1))]])[len(PREFIX + ram_start()) :]
    with pytest.raises(VmmError):
        split(data, tmp_path)


def test_start_body_without_block_list(tmp_path: Path) -> None:
    start = ram_start()
    header_len = 1 + 4 + 4 + 4 + 4
    body = be64(RAM_SIZE) + start[header_len + 8 :]  # MEM_SIZE flag missing
    data = PREFIX + start[:header_len] + body + TAIL
    with pytest.raises(VmmError, match="does not start with the block list"):
        split(data, tmp_path)


def test_block_list_without_eos(tmp_path: Path) -> None:
    start = ram_start()
    data = PREFIX + start[: -len(footer()) - 8] + be64(FLAG_EOS | FLAG_ZERO) + footer() + TAIL
    with pytest.raises(VmmError, match="not followed by EOS"):
        split(data, tmp_path)


@pytest.mark.parametrize("bad", [b"\x7f" + be32(RAM_ID), bytes([SECTION_FOOTER]) + be32(RAM_ID + 1)])
def test_bad_footer_after_setup(bad: bytes, tmp_path: Path) -> None:
    start = ram_start()[: -len(footer())] + bad
    with pytest.raises(VmmError, match=f"bad footer for section {RAM_ID}"):
        split(PREFIX + start + TAIL, tmp_path)


def test_bad_footer_after_part(tmp_path: Path) -> None:
    part = bytes([SECTION_PART]) + be32(RAM_ID) + Rec(b"ram", 0, page(1)).encode(False) + be64(FLAG_EOS)
    data = PREFIX + ram_start() + part + footer(RAM_ID + 7) + TAIL
    with pytest.raises(VmmError, match="bad footer"):
        split(data, tmp_path)


def test_other_iterable_section_is_rejected(tmp_path: Path) -> None:
    """A PART of another section id (e.g. dirty bitmaps) is not something we can split."""
    data = PREFIX + ram_start() + bytes([SECTION_PART]) + be32(RAM_ID + 1) + be64(FLAG_EOS) + footer(RAM_ID + 1)
    with pytest.raises(VmmError, match=f"section {RAM_ID + 1} is not RAM"):
        split(data + TAIL, tmp_path)


def test_rec_helper_matches_qemu_layout() -> None:
    """Sanity of the test's own encoder: header, name, payload."""
    encoded = Rec(b"pc.bios", 3 * PAGE_SIZE, None, fill=7).encode(False)
    assert encoded == be64(3 * PAGE_SIZE | FLAG_ZERO) + b"\x07pc.bios" + b"\x07"
    assert replace(Rec(b"ram", 0), fill=1).encode(True) == be64(FLAG_ZERO | FLAG_CONTINUE) + b"\x01"


def test_a_sink_hears_of_every_refill_before_the_records_it_brought(tmp_path: Path) -> None:
    """A page sink that caches facts about the source's memory (the page map) must drop them whenever more of
    the stream is read: every record it sees was sent before the last ``refilled`` call before it."""
    sections = [[Rec(b"ram", n * PAGE_SIZE, page(n)) for n in range(16)] + [Rec(b"ram", 20 * PAGE_SIZE)]]
    data = stream(sections)
    events: list[tuple[str, int]] = []

    class Sink:
        def page(self, addr: int, data: memoryview) -> None:
            events.append(("page", addr))

        def zero(self, addr: int) -> None:
            events.append(("zero", addr))

        def refilled(self) -> None:
            events.append(("refill", -1))

    out = io.BytesIO()
    stats = split_stream(Dribble(data, 3 * PAGE_SIZE), out, Sink())
    assert stats.pages == 16 and stats.zero_pages == 1
    assert [addr for kind, addr in events if kind != "refill"] == [n * PAGE_SIZE for n in range(16)] + [20 * PAGE_SIZE]
    assert events[0] == ("refill", -1)
    assert sum(1 for kind, _ in events if kind == "refill") >= len(data) // (3 * PAGE_SIZE)
