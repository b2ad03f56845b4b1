"""Helpers for tests that need network namespaces of their own (all traffic stays inside them)."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import socket
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

from pyroute2 import IPRoute, netns

from cryobox.bench.fakeguest import attach_fake_guest

__all__ = ["attach_fake_guest"]  # the slots' stand-in guest lives with the bench that measures with it
T = TypeVar("T")


def in_thread_netns(name: str | None, fn: Callable[[], T]) -> T:
    """Run ``fn`` on a fresh thread moved into netns ``name`` (the thread dies afterwards)."""
    out: list[T] = []
    err: list[BaseException] = []

    def target() -> None:
        try:
            if name is not None:
                netns.setns(name, flags=0)
            out.append(fn())
        except BaseException as exc:
            err.append(exc)

    t = threading.Thread(target=target)
    t.start()
    t.join()
    if err:
        raise err[0]
    return out[0]


def socket_in(name: str | None) -> socket.socket:
    """A TCP socket living in netns ``name`` (sockets keep their netns whatever thread uses them)."""
    return in_thread_netns(name, lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM))


class Listener:
    """Accepts on ``addr`` inside netns ``name`` and greets every connection with b"hi"."""

    def __init__(self, name: str | None, addr: str) -> None:
        self.sock = socket_in(name)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((addr, 0))
        self.sock.listen(16)
        self.sock.settimeout(0.1)
        self.port = int(self.sock.getsockname()[1])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            with conn:
                conn.sendall(b"hi")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


REACH_S = 5.0
"""How long a probe expected to answer ``"ok"`` may take: under a full suite's load 1 s was once not enough for the
first connection to a fresh slot (a probe expected to be dropped keeps the short default: it waits it all out)."""


def probe(name: str | None, addr: str, port: int, timeout: float = 1.0) -> str:
    """Connect from netns ``name`` (None: host): "ok", "timeout" (dropped), "refused" or an errno."""
    sock = socket_in(name)
    sock.settimeout(timeout)
    try:
        sock.connect((addr, port))
        return "ok" if sock.recv(2) == b"hi" else "bad-greeting"
    except TimeoutError:
        return "timeout"
    except ConnectionRefusedError:
        return "refused"
    except OSError as exc:
        return f"errno-{exc.errno}"
    finally:
        sock.close()


def ns_fd(name: str) -> int:
    return os.open(f"/run/netns/{name}", os.O_RDONLY)


OUTSIDE_RANGE = "10.199.0.0/16"
"""Where :func:`outside_network` puts "the internet" by default (RFC 1918: exempted by the test operator)."""


@contextlib.contextmanager
def outside_network(tag: str, network: str | None = None) -> Iterator[tuple[str, str]]:
    """A stand-in for "the internet": a netns behind its own non-cb veth from the host. Yields (cidr, server ip).

    ``network`` is the /30 to use (default: a random one in ``10.199.0.0/16``, the range the test server's
    operator exempts from the egress deny list)."""
    name, link = f"cryobox-{tag}-out", f"xo{tag}"
    net = ipaddress.IPv4Network(network or f"10.199.{random.randint(0, 255)}.0/30")
    cidr, host_ip, server_ip = str(net), str(net.network_address + 1), str(net.network_address + 2)
    netns.create(name)
    try:
        fd = ns_fd(name)
        try:
            with IPRoute() as ipr:
                ipr.link("add", ifname=link, kind="veth", peer={"ifname": "eth0", "net_ns_fd": fd})
                idx = ipr.link_lookup(ifname=link)[0]
                ipr.addr("add", index=idx, address=host_ip, prefixlen=30)
                ipr.link("set", index=idx, state="up")
        finally:
            os.close(fd)

        def inside() -> None:
            with IPRoute() as ipr:
                ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")
                idx = ipr.link_lookup(ifname="eth0")[0]
                ipr.addr("add", index=idx, address=server_ip, prefixlen=30)
                ipr.link("set", index=idx, state="up")

        in_thread_netns(name, inside)
        yield cidr, server_ip
    finally:
        with IPRoute() as ipr:
            for idx in ipr.link_lookup(ifname=link):
                ipr.link("del", index=idx)
        if os.path.exists(f"/run/netns/{name}"):
            netns.remove(name)
