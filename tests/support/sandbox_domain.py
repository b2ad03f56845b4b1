"""A sandbox domain built on this machine, for the tests of sandbox hosts (``{port}-{id}.{domain}``): a test CA and
its wildcard certificate for the server, and a network namespace for the client where every name under the domain
resolves to an address that reaches the server's HTTPS listener on 443 — wildcard DNS and a public certificate, as
an operator would set them up, with nothing leaving the machine.

The namespace is a :class:`~tests.support.loopfwd.LoopbackNamespace` (only ``lo``; ``127.0.0.1:443`` relayed to the
server's HTTPS port on the host's loopback) with a DNS server on ``127.0.0.1:53`` answering ``*.{domain}`` and
``{domain}`` with ``127.0.0.1``. A program run with :meth:`DomainNamespace.run` goes through ``ip netns exec``,
which mounts ``/etc/netns/<name>/resolv.conf`` (naming that server) over ``/etc/resolv.conf`` for it alone."""

from __future__ import annotations

import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

from cryobox.bench.server import ServeProcess
from tests.support.internet_dns import Zone
from tests.support.internet_servers import Hub, Service
from tests.support.internet_tls import Authority
from tests.support.loopfwd import LoopbackNamespace
from tests.support.netutil import in_thread_netns

LOOPBACK = "127.0.0.1"
HTTPS = 443
NETNS_ETC = Path("/etc/netns")
DOMAIN = "cbx.test"
"""The sandbox domain of the host tests' servers (``hosted`` in tests/integration/compat/conftest.py)."""


@dataclass(frozen=True)
class Hosted:
    """A server with sandbox hosts under :data:`DOMAIN`: its HTTPS port and the CA its certificate is from."""

    serve: ServeProcess
    https_port: int
    authority: Authority


def wildcard_certificate(domain: str, directory: Path) -> tuple[Authority, Path, Path]:
    """A test CA and a certificate (file, key file) for ``*.{domain}`` and ``{domain}`` it signed."""
    authority = Authority(domain, directory)
    cert, key = authority.issue([f"*.{domain}", domain])
    return authority, cert, key


class DomainNamespace:
    """The client's side of a sandbox domain (module doc); a context manager, idempotent :meth:`close`."""

    def __init__(self, domain: str, https_port: int) -> None:
        self.domain = domain
        self.zone = Zone(ttl=5)
        self.zone.set(f"*.{domain}", [LOOPBACK])
        self.zone.set(domain, [LOOPBACK])
        self._hub = Hub("cryobox-domain-")
        self._ns = LoopbackNamespace([])
        self.name = self._ns.name
        self._etc = NETNS_ETC / self.name
        try:
            self._ns.add(HTTPS, to=https_port)
            self._etc.mkdir(parents=True)
            (self._etc / "resolv.conf").write_text(f"nameserver {LOOPBACK}\noptions attempts:2 timeout:2\n")
            services = [
                Service("dns", socket.AF_INET, socket.SOCK_DGRAM, LOOPBACK, 53, datagram=self.zone.serve_datagram),
                Service("dns-tcp", socket.AF_INET, socket.SOCK_STREAM, LOOPBACK, 53, stream=self.zone.serve_stream),
            ]
            sockets = in_thread_netns(self.name, lambda: [service.open() for service in services])
            for service, sock in zip(services, sockets, strict=True):
                self._hub.add(service, sock)
            self._hub.start()
        except BaseException:
            self.close()
            raise

    def run(self, argv: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
        """``argv`` in the namespace, with its resolver; ``env`` is its whole environment."""
        return subprocess.run(
            ["ip", "netns", "exec", self.name, *argv], env=env, capture_output=True, text=True, timeout=timeout
        )

    @property
    def errors(self) -> list[BaseException]:
        """What the DNS server raised (a bug of its own, never a client's doing)."""
        return list(self._hub.errors)

    def close(self) -> None:
        stuck = self._hub.stop()
        self._ns.close()
        shutil.rmtree(self._etc, ignore_errors=True)
        assert not stuck, f"DNS threads still alive: {stuck}"

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
