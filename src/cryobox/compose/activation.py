"""Listening sockets handed over by a supervisor: systemd's socket activation (``sd_listen_fds(3)``).

With a ``.socket`` unit (``packaging/systemd/``) systemd owns the listening socket and passes it to each process
it starts as fd 3 onwards, naming them in ``LISTEN_FDS``, ``LISTEN_PID`` and ``LISTEN_FDNAMES``. The socket
outlives every restart and upgrade of the service: a request that arrives while the new process starts waits in
the socket's backlog instead of being refused, and is answered once the new process serves.

Names (``FileDescriptorName=`` in the unit): ``http`` for the plain listener, ``https`` for the TLS one; unnamed
sockets are taken in that order. The protocol is a few environment variables and fds: no library needed (the
C ``libsystemd`` binding would be a build dependency for ten lines).
"""

from __future__ import annotations

import os
import socket
from collections.abc import MutableMapping
from dataclasses import dataclass, field

from ..errors import InvalidArgument
from ..util.tcp import no_delay

FIRST_FD = 3
"""``SD_LISTEN_FDS_START``."""
NAMES = ("http", "https")
ENV = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")


@dataclass
class Activation:
    """The sockets a supervisor passed, by name (empty: bind as the options say)."""

    sockets: dict[str, socket.socket] = field(default_factory=dict)

    def get(self, name: str) -> socket.socket | None:
        return self.sockets.get(name)

    def describe(self, name: str) -> str:
        sock = self.sockets[name]
        host, port = sock.getsockname()[:2]
        return f"{host}:{port} (from the supervisor, fd {sock.fileno()})"


def take_activation(
    env: MutableMapping[str, str] | None = None, pid: int | None = None, first_fd: int = FIRST_FD
) -> Activation:
    """The listening sockets passed to this process, if any; the variables are removed from ``env`` (so no child
    process takes them for its own) and the fds made non-inheritable.

    :raises InvalidArgument: a passed fd is not a listening TCP socket, or names repeat or are unknown."""
    env = os.environ if env is None else env
    values = {key: env.pop(key, None) for key in ENV}
    count, owner = values["LISTEN_FDS"], values["LISTEN_PID"]
    if count is None or owner is None or not owner.isdigit() or int(owner) != (os.getpid() if pid is None else pid):
        return Activation()  # not for us (a variable left by a parent that was itself activated)
    if not count.isdigit():
        raise InvalidArgument(f"LISTEN_FDS is not a number: {count!r}")
    names = (values["LISTEN_FDNAMES"] or "").split(":") if values["LISTEN_FDNAMES"] else []
    activation = Activation()
    unnamed = iter(NAMES)
    try:
        for index in range(int(count)):
            fd = first_fd + index
            name = names[index] if index < len(names) and names[index] not in ("", "unknown") else next(unnamed, "")
            if name not in NAMES or name in activation.sockets:
                raise InvalidArgument(
                    f"passed socket {fd} is named {name!r}: name them {' and '.join(NAMES)} (FileDescriptorName=)"
                )
            sock = socket.socket(fileno=fd)
            if sock.type != socket.SOCK_STREAM or not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                sock.detach()
                raise InvalidArgument(f"passed fd {fd} ({name}) is not a listening stream socket")
            sock.set_inheritable(False)
            activation.sockets[name] = no_delay(sock)  # whoever made it may not have
    except BaseException:
        for taken in activation.sockets.values():
            taken.detach()  # a refused hand-over leaves the fds as they came
        raise
    return activation
