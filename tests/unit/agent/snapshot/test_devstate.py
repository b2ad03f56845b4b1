"""The pieces of the short-pause capture (agent/snapshot/devstate.py) without a VM: the written runs of a real private
mapping of this process, their copy out of ``/proc/self/mem``, the layer accounting, and the vmstate framing."""

from __future__ import annotations

import ctypes
import mmap
import os
import shutil
import struct
from pathlib import Path

import pytest

from cryobox.agent.snapshot.devstate import copy_written, write_pending
from cryobox.agent.snapshot.memlayer import AllWritten, LayerImage, account_runs
from cryobox.agent.snapshot.pagemap import written_runs
from cryobox.agent.snapshot.shortpause import fill_unwritten
from cryobox.agent.vm.vmstream import config_prefix, devices_vmstate
from cryobox.errors import VmmError
from cryobox.util.files import allocated_bytes

PAGE = 4096
PAGES = 4096


def _image(path: Path, pages: dict[int, int], size_pages: int = PAGES) -> Path:
    with open(path, "wb") as fh:
        fh.truncate(size_pages * PAGE)
        for n, byte in pages.items():
            os.pwrite(fh.fileno(), bytes([byte]) * PAGE, n * PAGE)
    return path


def test_written_runs_and_their_copy_are_exactly_the_pages_a_process_wrote(tmp_path: Path) -> None:
    parent = _image(Path(f"/dev/shm/cryobox-test-runs-{os.getpid()}"), {n: 1 for n in range(16)})
    try:
        with open(parent, "rb+") as fh:
            m = mmap.mmap(fh.fileno(), PAGES * PAGE, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE)
        try:
            for off in range(0, PAGES * PAGE, PAGE):
                m[off]  # every page present, still the file's
            for page in (2, 3, 4, 9, 4095):
                m[page * PAGE + 7] = 0x55
            lo = ctypes.addressof(ctypes.c_char.from_buffer(m))
            runs = written_runs(os.getpid(), lo, lo + PAGES * PAGE)
            assert runs == [(2 * PAGE, 3 * PAGE), (9 * PAGE, PAGE), (4095 * PAGE, PAGE)]

            layer = tmp_path / "layer"
            shutil.copyfile(parent, layer)  # what the reflink clone of the parent gives
            fd = os.open(layer, os.O_RDWR)
            try:
                staging = bytearray(3 * PAGE)
                staged = copy_written(os.getpid(), lo, lo + PAGES * PAGE, fd, staging)
                assert staged.runs == runs
                # the first run fits the in-memory budget: held for after the pause; the rest went to the file at once
                assert staged.pending == [(2 * PAGE, 0, 3 * PAGE)]
                assert staged.direct == [(9 * PAGE, PAGE), (4095 * PAGE, PAGE)]
                pending = staged.pending
                assert os.pread(fd, PAGE, 2 * PAGE) == bytes([1]) * PAGE and os.pread(fd, 1, 9 * PAGE + 7) == b"U"
                write_pending(fd, staging, pending)
            finally:
                os.close(fd)
            assert layer.read_bytes() == bytes(m)  # the parent's pages plus exactly what was written
            with pytest.raises(VmmError, match="bad RAM mapping"):
                written_runs(os.getpid(), lo + 1, lo + PAGE)
        finally:
            m.close()
    finally:
        parent.unlink(missing_ok=True)


def test_accounting_keeps_pages_equal_to_the_parent_shared_and_zeroed_ones_as_holes(tmp_path: Path) -> None:
    parent = _image(tmp_path / "parent", {0: 1, 1: 2, 2: 3, 3: 4}, size_pages=8)
    layer = tmp_path / "layer"
    shutil.copyfile(parent, layer)
    fd = os.open(layer, os.O_RDWR)
    parent_fd = os.open(parent, os.O_RDONLY)
    try:
        os.pwrite(fd, bytes([9]) * PAGE, 0)  # changed
        os.pwrite(fd, bytes(PAGE), 2 * PAGE)  # zeroed: a hole
        os.pwrite(fd, bytes([7]) * PAGE, 5 * PAGE)  # new over a hole of the parent
        sink = LayerImage(fd, parent_fd, AllWritten(), "p" * 64)
        # pages 0-2 and 5 were written (page 1 back to its parent's bytes)
        pages, zeros = account_runs(sink, [(0, 3 * PAGE), (5 * PAGE, PAGE)], chunk=2 * PAGE)
    finally:
        os.close(fd)
        os.close(parent_fd)
    assert (pages, zeros) == (3, 1)
    assert sink.own_pages == 2 and sink.same_pages == 1
    data = layer.read_bytes()
    assert data[:PAGE] == bytes([9]) * PAGE and data[PAGE : 2 * PAGE] == bytes([2]) * PAGE
    assert data[2 * PAGE : 3 * PAGE] == bytes(PAGE) and data[5 * PAGE : 6 * PAGE] == bytes([7]) * PAGE


def _config(machine: bytes = b"microvm", caps: tuple[bytes, ...] = (b"x-ignore-shared",)) -> bytes:
    sub = b"configuration/capabilities"
    body = b"\x05" + bytes([len(sub)]) + sub + struct.pack(">II", 1, len(caps))
    body += b"".join(bytes([len(c)]) + c for c in caps)
    return b"QEVM\x00\x00\x00\x03" + b"\x07" + struct.pack(">I", len(machine)) + machine + body


def test_a_device_state_file_gets_the_configuration_of_the_stream_the_vm_came_from() -> None:
    config = _config()
    template = config + b"\x01\x00\x00\x00\x02\x03ram" + bytes(64)  # a baked template: the ram section follows
    assert config_prefix(template) == config
    devices = b"QEVM\x00\x00\x00\x03" + b"\x04\x00\x00\x00\x00\x05timer" + bytes(32)
    vmstate = devices_vmstate(config, devices)
    assert vmstate == config + devices[8:] + b"\x06\x00\x00\x00\x02{}"  # and an empty vmdesc after EOF
    assert config_prefix(vmstate) == config  # a snapshot of a restore of it finds the same configuration

    for bad in (b"QEVM\x00\x00\x00\x03\x04", config[:20], b"QEVM\x00\x00\x00\x02" + config[8:] + b"\x01"):
        with pytest.raises(VmmError):
            config_prefix(bad)
    with pytest.raises(VmmError, match="unknown configuration subsection"):
        config_prefix(config.replace(b"configuration/capabilities", b"configuration/somethingelse") + b"\x01")
    with pytest.raises(VmmError, match="device section"):
        devices_vmstate(config, template)
    with pytest.raises(VmmError, match="EOF"):
        devices_vmstate(config, devices + b"\x01")


def test_a_whole_image_takes_the_written_runs_and_the_rest_from_the_mapped_file(tmp_path: Path) -> None:
    source = _image(tmp_path / "parent", {0: 1, 1: 2, 5: 6, 7: 8}, size_pages=8)
    out = tmp_path / "whole"
    fd = os.open(out, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.ftruncate(fd, 8 * PAGE)
        os.pwrite(fd, bytes([9]) * PAGE + bytes(PAGE), 1 * PAGE)  # written: page 1 changed, page 2 zeroed
        pages, zeros = fill_unwritten(fd, source, [(1 * PAGE, 2 * PAGE)], 8 * PAGE)
    finally:
        os.close(fd)
    assert (pages, zeros) == (4, 4)  # pages 0, 1, 5, 7 hold data; 2, 3, 4, 6 are zero
    data = out.read_bytes()
    expected = {0: 1, 1: 9, 5: 6, 7: 8}
    for n in range(8):
        assert data[n * PAGE : (n + 1) * PAGE] == bytes([expected.get(n, 0)]) * PAGE, n
    assert allocated_bytes(out) <= 4 * PAGE  # zero pages are holes
