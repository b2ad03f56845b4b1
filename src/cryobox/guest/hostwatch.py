"""Whether the host is on the other end of the agent's virtio-serial port, and being woken when it comes.

While nobody holds the host end (the host agent restarting; a restored VM before its new agent connects), the
guest's port polls as hang-up at once and reads end at once, forever: there is nothing to block on. What the
kernel's virtio_console does give is a SIGIO to the port's owner when the host connects (``O_ASYNC``), so the
agent owns the port's signals in its main thread, keeps SIGIO blocked there and waits for it with
``sigtimedwait``: a waiting guest does not run at all until its host is back.
"""

from __future__ import annotations

import fcntl
import os
import select
import signal
import struct
import threading

F_SETOWN_EX = getattr(fcntl, "F_SETOWN_EX", 15)
F_OWNER_TID = 0


def block_sigio() -> None:
    """SIGIO blocked in this thread (and so in every thread it starts), with a handler that does nothing, so that
    a SIGIO never ends the process (its default action) whichever thread it reaches; ``sigtimedwait`` takes it."""
    signal.signal(signal.SIGIO, lambda _signum, _frame: None)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGIO})


def watch_host(fd: int) -> None:
    """Have the kernel send SIGIO to this thread (not any thread of the process) when ``fd``'s state changes."""
    fcntl.fcntl(fd, F_SETOWN_EX, struct.pack("ii", F_OWNER_TID, threading.get_native_id()))
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_ASYNC)


def host_away(fd: int) -> bool:
    """True while nobody holds the other end: the port polls as hang-up (no wait, nothing consumed)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return any(events & select.POLLHUP for _fd, events in poller.poll(0))
