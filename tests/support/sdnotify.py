"""A stand-in for systemd's notification socket: a datagram socket that records who said what (``SO_PASSCRED``:
the kernel stamps each datagram with the sender's pid, which is how systemd applies ``NotifyAccess=main``)."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path


class NotifySocket:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.messages: list[tuple[int, str]] = []
        """``(sender pid, line)`` in the order received."""
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self._sock.bind(str(path))
        self._sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, name="notify socket", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        creds = socket.CMSG_SPACE(struct.calcsize("3i"))
        while not self._stop.is_set():
            try:
                data, ancillary, _flags, _addr = self._sock.recvmsg(4096, creds)
            except TimeoutError:
                continue
            except OSError:
                return
            pid = next((struct.unpack("3i", d)[0] for lvl, kind, d in ancillary if kind == socket.SCM_CREDENTIALS), -1)
            self.messages.extend((pid, line) for line in data.decode().splitlines())

    def wait_for(self, line: str, pid: int | None = None, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not any(m == line and pid in (None, p) for p, m in self.messages):
            assert time.monotonic() < deadline, f"no {line!r} from {pid}: {self.messages}"
            time.sleep(0.02)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


@contextlib.contextmanager
def notify_socket(path: Path) -> Iterator[NotifySocket]:
    listener = NotifySocket(path)
    try:
        yield listener
    finally:
        listener.close()
