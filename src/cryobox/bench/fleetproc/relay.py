"""The loopback relay of an agent namespace, a process of its own: ``python -m cryobox.bench.fleetproc.relay
NETNS_PATH PORT...`` (started by :meth:`.netns.AgentNetns.forward_loopback`; prints ``ready`` once listening).

The control plane and the store listen on ``127.0.0.1`` of the root namespace only. The relay opens listening
sockets *inside* the agent's namespace on ``127.0.0.1:<the same port>`` (a socket belongs to the namespace of the
thread that created it: a short-lived thread ``setns``-es there, binds, and exits) and forwards each connection to
``127.0.0.1:<port>`` of the root namespace. So every agent is given exactly the URLs the root namespace uses
(``--control http://127.0.0.1:P``, ``--store s3://B?endpoint=http://127.0.0.1:M``): the store's canonical identity
(its URL, see :mod:`cryobox.objstore.client`) is the same on every host and in the control plane, nothing
listens on a non-loopback address of the machine, and the only non-loopback traffic is control plane ->
``10.250.<i>.2`` over the veth pairs.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from .system import die_with_parent, socket_in_netns

RELAY_CHUNK = 1 << 20


def _splice(src: socket.socket, dst: socket.socket) -> None:
    """Copy ``src`` to ``dst`` until EOF through a pipe with ``splice(2)`` (no copy through Python, GIL released),
    then half-close ``dst``; on an error, shut both down so the other direction ends too."""
    read_end, write_end = os.pipe()
    try:
        with contextlib.suppress(OSError):
            fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, RELAY_CHUNK)
        while moved := os.splice(src.fileno(), write_end, RELAY_CHUNK):
            while moved:
                moved -= os.splice(read_end, dst.fileno(), moved)
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
    finally:
        os.close(read_end)
        os.close(write_end)


def _relay_connection(client: socket.socket, port: int) -> None:
    try:
        upstream = socket.create_connection(("127.0.0.1", port), timeout=10)
    except OSError:
        client.close()
        return
    upstream.settimeout(None)
    for sock in (client, upstream):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    back = threading.Thread(target=_splice, args=(upstream, client), daemon=True)
    back.start()
    _splice(client, upstream)
    back.join()
    client.close()
    upstream.close()


def _accept_loop(listener: socket.socket, port: int) -> None:
    while True:
        client, _ = listener.accept()
        threading.Thread(target=_relay_connection, args=(client, port), daemon=True).start()


def relay_main(netns_path: str, ports: list[int]) -> None:
    """Listen on 127.0.0.1:<port> inside ``netns_path`` for each port; forward to 127.0.0.1:<port> here (this
    process stays in the root namespace: only the listening sockets were made in the other one)."""
    die_with_parent()
    threads = []
    for port in ports:
        listener = socket_in_netns(Path(netns_path))
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(256)
        threads.append(threading.Thread(target=_accept_loop, args=(listener, port), daemon=True))
    for thread in threads:
        thread.start()
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    for thread in threads:
        thread.join()


def main(argv: Sequence[str]) -> None:
    if len(argv) < 2 or not all(port.isdigit() for port in argv[1:]):
        raise SystemExit("usage: python -m cryobox.bench.fleetproc.relay NETNS_PATH PORT...")
    relay_main(argv[0], [int(port) for port in argv[1:]])


if __name__ == "__main__":
    main(sys.argv[1:])
