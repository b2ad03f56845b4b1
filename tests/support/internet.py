"""A stand-in for "the internet" for tests of the host-side egress proxy: one network namespace behind a veth from
the host, holding a DNS server, HTTP and HTTPS servers (a test CA's certificates), UDP echo and a banner server, on
several addresses of ``10.199.<k>.0/24`` (the range the test operator exempts from the egress deny list) and on
one IPv6 address (for tests that IPv6 is dropped). Nothing leaves this machine.

The servers tell what reached them (the local address, Host, SNI, body length) and the DNS server what it was
asked, so a test can show where a connection really went and that a denied name was never looked up upstream.

Everything carries the caller's tag: the namespace is ``cryobox-<tag>-net`` and the host's veth end ``xi<tag>``,
so an interrupted run is reclaimed by tag (:func:`reclaim_internet`; the suite's own reclaim of a tag removes the
namespace, and the veth goes with it)."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import re
import shutil
import socket
import ssl
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pyroute2 import IPRoute, netns

from tests.support.internet_dns import Zone
from tests.support.internet_servers import Hub, Service, banner_echo, echo, http
from tests.support.internet_tls import Authority, ServerTls
from tests.support.netutil import in_thread_netns, ns_fd

SERVER_HOSTS = (10, 11, 12, 13)
"""Host numbers of the server addresses in the /24 (HTTP on 80, HTTPS on 443, the banner server on 7000)."""
DNS_HOST = 53
"""Host number of the DNS server's address (UDP and TCP 53)."""
RAW_PORT = 7000
UDP_ECHO_PORTS = (443, 9999)
"""UDP echo on the first server address: 443 is what QUIC would use."""
_IFA_F_NODAD = 0x02  # IPv6 addresses usable at once, not after duplicate address detection's second or so
_TAG = re.compile(r"^[0-9a-f]{6}$")


def default_names(k: int) -> dict[str, tuple[list[str], list[str]]]:
    """The names every internet answers for: name -> (A answers, AAAA answers)."""
    net = f"10.199.{k}"
    return {
        "example.org": ([f"{net}.10"], []),
        "www.example.org": ([f"{net}.10"], []),
        "api.example.com": ([f"{net}.11"], []),
        "cdn-a.example.net": ([f"{net}.12"], []),  # two names on one address: a policy may allow one and not
        "cdn-b.example.net": ([f"{net}.12"], []),  # the other
        "other.example.com": ([f"{net}.13"], []),
        "rebind.example.org": (["10.0.0.5"], []),  # DNS rebinding: a public name answering a private address
        "meta.example.org": (["169.254.169.254"], []),  # ... or the cloud metadata service
        "v6.example.org": ([], [f"fd00:cb:{k}::10"]),
    }


def _check(tag: str) -> str:
    if not _TAG.match(tag):
        raise ValueError(f"tag must be 6 lowercase hex characters, got {tag!r}")
    return tag


def _routed(ipr: Any, family: int) -> list[str]:
    """Destinations of the host's routes in ``family`` (the default route aside)."""
    return [
        f"{dst}/{route['dst_len']}" for route in ipr.get_routes(family=family) if (dst := route.get_attr("RTA_DST"))
    ]


def _free_k() -> int:
    """A random ``k`` whose ``10.199.<k>.0/24`` and ``fd00:cb:<k>::/64`` no host route covers yet."""
    with IPRoute() as ipr:
        taken4 = [ipaddress.IPv4Network(dst, strict=False) for dst in _routed(ipr, socket.AF_INET)]
        taken6 = [ipaddress.IPv6Network(dst, strict=False) for dst in _routed(ipr, socket.AF_INET6)]
    candidates = list(range(256))
    random.shuffle(candidates)
    for k in candidates:
        mine4, mine6 = ipaddress.IPv4Network(f"10.199.{k}.0/24"), ipaddress.IPv6Network(f"fd00:cb:{k}::/64")
        if not any(mine4.overlaps(net) for net in taken4) and not any(mine6.overlaps(net) for net in taken6):
            return k
    raise RuntimeError("no free 10.199.<k>.0/24 on this host")


def reclaim_internet(tag: str) -> list[str]:
    """Remove what an internet tagged ``tag`` left (a crashed run): its host link, its namespace and its CA's
    directory. Idempotent; returns what went."""
    name, link = f"cryobox-{_check(tag)}-net", f"xi{tag}"
    gone: list[str] = []
    with IPRoute() as ipr:
        for index in ipr.link_lookup(ifname=link):
            with contextlib.suppress(Exception):  # gone meanwhile (its namespace went first)
                ipr.link("del", index=index)
                gone.append(f"link {link}")
    if os.path.exists(f"/run/netns/{name}"):
        with contextlib.suppress(FileNotFoundError):
            netns.remove(name)
            gone.append(f"netns {name}")
    for workdir in Path(tempfile.gettempdir()).glob(f"cryobox-{tag}-internet-*"):
        shutil.rmtree(workdir, ignore_errors=True)
        gone.append(f"directory {workdir}")
    return gone


class Internet:
    """One stand-in internet (see the module). Build it with :func:`internet`."""

    def __init__(self, tag: str, ttl: int = 60) -> None:
        self.tag = _check(tag)
        self.netns = f"cryobox-{tag}-net"
        self.link = f"xi{tag}"
        """The host's end of the veth (the namespace's end is its ``eth0``)."""
        self.k = _free_k()
        base = f"10.199.{self.k}"
        self.cidr = f"{base}.0/24"
        self.host_ip = f"{base}.1"
        """The host's address on the link: where the servers see host traffic come from."""
        self.servers = tuple(f"{base}.{n}" for n in SERVER_HOSTS)
        self.dns = f"{base}.{DNS_HOST}"
        self.ip6_prefix = f"fd00:cb:{self.k}::/64"
        self.host_ip6 = f"fd00:cb:{self.k}::1"
        self.server_ip6 = f"fd00:cb:{self.k}::10"
        """HTTP (80) and HTTPS (443) over IPv6."""
        self.zone = Zone(ttl)
        for name, (ipv4, ipv6) in default_names(self.k).items():
            self.zone.set(name, ipv4, ipv6)
        self.workdir = Path(tempfile.mkdtemp(prefix=f"cryobox-{tag}-internet-"))
        self._ca: Authority | None = None
        self._hub: Hub | None = None
        self._extra = 0
        self._created = False  # the namespace is ours: one of the same tag already there is someone else's
        self._closed = False

    @property
    def ca_pem(self) -> bytes:
        """The test CA every HTTPS server's certificate chains to."""
        assert self._ca is not None, "not started"
        return self._ca.pem

    @property
    def ca_file(self) -> Path:
        assert self._ca is not None, "not started"
        return self._ca.file

    @property
    def authority(self) -> Authority:
        """The test CA, to issue certificates for servers of the test's own (e.g. a registry)."""
        assert self._ca is not None, "not started"
        return self._ca

    def add_address(self) -> str:
        """One more IPv4 address of the namespace's ``eth0`` (``.20`` on), for a server of the test's own."""
        address = f"10.199.{self.k}.{20 + self._extra}"
        self._extra += 1

        def inside() -> None:
            with IPRoute() as ipr:
                ipr.addr("add", index=ipr.link_lookup(ifname="eth0")[0], address=address, prefixlen=24)

        in_thread_netns(self.netns, inside)
        return address

    def client_context(self) -> ssl.SSLContext:
        """A client TLS context that trusts the test CA (and nothing else)."""
        return ssl.create_default_context(cadata=self.ca_pem.decode())

    def addr(self, name: str) -> str:
        """The first address ``name`` resolves to (IPv4 before IPv6); KeyError for a name the DNS does not know."""
        records = self.zone.lookup(name)
        if records is None:
            raise KeyError(name)
        return (records.ipv4 + records.ipv6)[0]

    def add_name(self, name: str, ipv4: Iterable[str] = (), ipv6: Iterable[str] = ()) -> None:
        """Answer ``name`` from now on (replacing its answers if known); thread-safe, also while running. HTTPS
        serves the name too (a certificate made the first time a client asks for it)."""
        self.zone.set(name, ipv4, ipv6)

    def remove_name(self, name: str) -> None:
        self.zone.remove(name)

    @property
    def queries(self) -> list[str]:
        """Every name the DNS server was asked, in order (lower case, no final dot)."""
        return self.zone.queries

    def clear_queries(self) -> None:
        self.zone.clear_queries()

    @property
    def errors(self) -> list[BaseException]:
        """Exceptions the servers raised (a bug of theirs, never a client's doing): a test may assert none."""
        return list(self._hub.errors) if self._hub is not None else []

    def start(self) -> None:
        """Make the namespace and its link, then start every server. On failure, :meth:`close` undoes it."""
        try:
            self._ca = Authority(self.tag, self.workdir)
            self._link_up()
            self._hub = Hub(f"cryobox-{self.tag}-")
            services = self._services(ServerTls(self._ca, self.zone.names(), [*self.servers, self.server_ip6]))
            sockets = in_thread_netns(self.netns, lambda: self._open(services))
            for service, sock in zip(services, sockets, strict=True):
                self._hub.add(service, sock)
            self._hub.start()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Stop every server, then delete the link and the namespace; idempotent. Raises if a server thread
        outlived its sockets (after removing everything else)."""
        if self._closed:
            return
        self._closed = True
        stuck = self._hub.stop() if self._hub is not None else []
        shutil.rmtree(self.workdir, ignore_errors=True)
        if self._created:
            reclaim_internet(self.tag)
        if stuck:
            raise RuntimeError(f"internet {self.tag}: threads still alive after stopping: {stuck}")

    def _link_up(self) -> None:
        if os.path.exists(f"/run/netns/{self.netns}"):  # checked first: pyroute2 leaks a socket when it fails
            raise FileExistsError(f"{self.netns} exists: tag {self.tag} is in use, or its leftovers await a reclaim")
        netns.create(self.netns)
        self._created = True
        fd = ns_fd(self.netns)
        try:
            with IPRoute() as ipr:
                ipr.link("add", ifname=self.link, kind="veth", peer={"ifname": "eth0", "net_ns_fd": fd})
                index = ipr.link_lookup(ifname=self.link)[0]
                ipr.addr("add", index=index, address=self.host_ip, prefixlen=24)
                ipr.addr("add", index=index, address=self.host_ip6, prefixlen=64, flags=_IFA_F_NODAD)
                ipr.link("set", index=index, state="up")
        finally:
            os.close(fd)

        def inside() -> None:
            with IPRoute() as ipr:
                ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")
                index = ipr.link_lookup(ifname="eth0")[0]
                for address in (*self.servers, self.dns):
                    ipr.addr("add", index=index, address=address, prefixlen=24)
                ipr.addr("add", index=index, address=self.server_ip6, prefixlen=64, flags=_IFA_F_NODAD)
                ipr.link("set", index=index, state="up")
                # replies to clients beyond the host (a sandbox's slot, forwarded by the host) go back through it
                ipr.route("add", dst="0.0.0.0/0", gateway=self.host_ip)
                ipr.route("add", dst="::/0", gateway=self.host_ip6, family=socket.AF_INET6)

        in_thread_netns(self.netns, inside)

    def _services(self, tls: ServerTls) -> list[Service]:
        tcp, udp, v4, v6 = socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.AF_INET, socket.AF_INET6
        found = [
            Service("dns", v4, udp, self.dns, 53, datagram=self.zone.serve_datagram),
            Service("dns-tcp", v4, tcp, self.dns, 53, stream=self.zone.serve_stream),
            Service("http6", v6, tcp, self.server_ip6, 80, stream=http),
            Service("https6", v6, tcp, self.server_ip6, 443, stream=http, tls=tls),
        ]
        for address in self.servers:
            found.append(Service("http", v4, tcp, address, 80, stream=http))
            found.append(Service("https", v4, tcp, address, 443, stream=http, tls=tls))
            found.append(Service("raw", v4, tcp, address, RAW_PORT, stream=banner_echo))
        found += [Service("udp-echo", v4, udp, self.servers[0], port, datagram=echo) for port in UDP_ECHO_PORTS]
        return found

    @staticmethod
    def _open(services: list[Service]) -> list[socket.socket]:
        opened: list[socket.socket] = []
        try:
            for service in services:
                opened.append(service.open())
        except BaseException:
            for sock in opened:
                sock.close()
            raise
        return opened


@contextlib.contextmanager
def internet(tag: str, ttl: int = 60) -> Iterator[Internet]:
    """A running stand-in internet tagged ``tag`` (6 lowercase hex characters), gone when the block ends (also when
    it fails). ``ttl`` is what the DNS answers carry."""
    net = Internet(tag, ttl)
    try:
        net.start()
        yield net
    finally:
        net.close()
