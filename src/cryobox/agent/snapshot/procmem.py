"""Reading a QEMU process's memory from outside: ``process_vm_readv(2)``, batched.

The short-pause capture (:mod:`.devstate`) copies the pages a guest wrote out of QEMU's RAM mapping while
the guest is stopped, so the copy's speed *is* the pause. ``process_vm_readv`` copies straight between the two
address spaces, many ranges per call (up to ``IOV_MAX`` on each side); a ``pread`` of ``/proc/<pid>/mem``
pins and maps one page at a time, which is slower (figures: docs/SPECIFICATION.md). The standard library has no
binding, so this one uses the process's own
libc through :mod:`ctypes`; where the call is refused (a kernel without it, a seccomp policy) it falls back to
``/proc/<pid>/mem``.
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Sequence
from typing import Any

from ...errors import VmmError

IOV_MAX = 1024


class _Iovec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


def _libc_call() -> Any:
    try:
        call = ctypes.CDLL(None, use_errno=True).process_vm_readv
    except AttributeError:
        return None
    call.argtypes = (
        ctypes.c_int,
        ctypes.POINTER(_Iovec),
        ctypes.c_ulong,
        ctypes.POINTER(_Iovec),
        ctypes.c_ulong,
        ctypes.c_ulong,
    )
    call.restype = ctypes.c_ssize_t
    return call


Copy = tuple[int, int, int]
"""``(remote address, position in the local buffer, length)``."""


class RemoteMemory:
    """Copies ranges of process ``pid``'s address space into a local writable buffer (:meth:`read`)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._call = _libc_call()
        self._mem = -1

    def read(self, buffer: memoryview, copies: Sequence[Copy]) -> None:
        """Fill ``buffer[pos:pos + length]`` from ``address`` for each copy.

        :raises VmmError: a range could not be read whole (QEMU exited, the mapping changed).
        """
        if buffer.readonly or not buffer.contiguous:
            raise VmmError("process memory is read into a writable contiguous buffer")
        base = ctypes.addressof(ctypes.c_char.from_buffer(buffer))
        for start in range(0, len(copies), IOV_MAX):
            batch = copies[start : start + IOV_MAX]
            if self._call is None or not self._readv(base, batch):
                self._pread(buffer, batch)

    def _readv(self, base: int, batch: Sequence[Copy]) -> bool:
        assert self._call is not None
        n = len(batch)
        local = (_Iovec * n)(*(_Iovec(base + pos, length) for _, pos, length in batch))
        remote = (_Iovec * n)(*(_Iovec(addr, length) for addr, _, length in batch))
        want = sum(length for _, _, length in batch)
        got = self._call(self.pid, local, n, remote, n, 0)
        if got < 0:
            err = ctypes.get_errno()
            if err in (errno.ENOSYS, errno.EPERM):
                self._call = None  # refused here: /proc/<pid>/mem from now on
                return False
            raise VmmError(f"cannot read QEMU {self.pid}'s RAM: {os.strerror(err)}")
        if got != want:
            raise VmmError(f"short read of QEMU {self.pid}'s RAM ({got} of {want} bytes)")
        return True

    def _pread(self, buffer: memoryview, batch: Sequence[Copy]) -> None:
        if self._mem < 0:
            try:
                self._mem = os.open(f"/proc/{self.pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
            except OSError as err:
                raise VmmError(f"cannot read QEMU {self.pid}'s RAM: {err}") from err
        for addr, pos, length in batch:
            if os.preadv(self._mem, [buffer[pos : pos + length]], addr) != length:
                raise VmmError(f"short read of QEMU {self.pid}'s RAM at {addr:#x}")

    def close(self) -> None:
        if self._mem >= 0:
            os.close(self._mem)
            self._mem = -1

    def __enter__(self) -> RemoteMemory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
