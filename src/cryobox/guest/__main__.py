"""Entry point: ``python3 -m cryobox_guest`` inside the VM, ``python -m cryobox.guest`` elsewhere.

By default serves the virtio-serial port named ``cryobox.agent`` forever, reopening it whenever the host
side goes away (after a snapshot restore the host reconnects on a new socket). ``--socket PATH`` connects
to a unix socket instead (with the same reconnect loop); ``--fd N`` serves an inherited fd once.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import time

from .agent import GuestAgent, log
from .hostwatch import block_sigio, host_away, watch_host
from .protocol import PORT_NAME
from .runtime import settle_environ

DEV_PORT = f"/dev/virtio-ports/{PORT_NAME}"
SYS_PORTS = "/sys/class/virtio-ports"
HOST_WAIT_S = 5.0
"""While the host is away (its agent restarting: the VM outlives it) the port answers hang-up at once, so the agent
waits for the kernel's SIGIO, which virtio_console sends when the host connects; this bounds what a lost signal
would cost. (It used to reopen the port every 10-250 ms: 50 waiting TCG guests burned 0.7 of a host core, which
the restarting agent needed.)"""
REOPEN_DELAY = 0.01  # --socket: after a session ends
RETRY_DELAY = 0.05  # while the port or socket does not exist yet


def find_port(dev_link: str = DEV_PORT, sys_dir: str = SYS_PORTS, dev_dir: str = "/dev") -> str | None:
    """Path of the agent's virtio-serial port, or None if it has not appeared yet."""
    if os.path.exists(dev_link):
        return dev_link
    try:
        names = sorted(os.listdir(sys_dir))
    except OSError:
        return None
    for name in names:
        try:
            with open(os.path.join(sys_dir, name, "name")) as handle:
                if handle.read().strip() != PORT_NAME:
                    continue
        except OSError:
            continue
        path = os.path.join(dev_dir, name)
        if os.path.exists(path):
            return path
    return None


def serve_port(agent: GuestAgent) -> None:
    waiting_logged = False
    opened_logged = False
    block_sigio()
    while True:
        path = find_port()
        if path is None:
            if not waiting_logged:
                log(f"waiting for virtio port {PORT_NAME}")
                waiting_logged = True
            time.sleep(RETRY_DELAY)
            continue
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except OSError as err:
            if not waiting_logged:
                log(f"cannot open {path}: {err}; retrying")
                waiting_logged = True
            time.sleep(RETRY_DELAY)
            continue
        if not opened_logged:
            log(f"serving {path}")
            opened_logged = True
        count = 0
        try:
            watch_host(fd)  # before looking: a host that connects between the look and the wait still wakes it
            while host_away(fd):
                signal.sigtimedwait([signal.SIGIO], HOST_WAIT_S)
            count = agent.serve_fd(fd)
        except Exception as err:  # keep serving whatever happens
            log(f"session on {path} failed: {err!r}")
        finally:
            os.close(fd)  # and reopen: the kernel drops what a host that went away left unread
        if count:
            log(f"host session ended after {count} requests; reopening {path}")


def serve_unix_socket(agent: GuestAgent, path: str) -> None:
    failing = False
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
        except OSError as err:
            sock.close()
            if not failing:
                log(f"cannot connect to {path}: {err}; retrying")
                failing = True
            time.sleep(RETRY_DELAY)
            continue
        failing = False
        log(f"connected to {path}")
        try:
            agent.serve_socket(sock)
        finally:
            sock.close()
        time.sleep(REOPEN_DELAY)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cryobox_guest", description="cryobox guest agent")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--socket", metavar="PATH", help="connect to this unix socket instead of the port")
    group.add_argument("--fd", type=int, metavar="N", help="serve this already-open fd once, then exit")
    options = parser.parse_args(argv)
    settle_environ(os.environ)
    agent = GuestAgent()
    try:
        if options.fd is not None:
            agent.serve_fd(options.fd)
        elif options.socket is not None:
            serve_unix_socket(agent, options.socket)
        else:
            serve_port(agent)
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
