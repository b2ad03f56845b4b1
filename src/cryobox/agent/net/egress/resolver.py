"""Names resolved on the host, for the guests: the egress proxy resolves the name a connection carried (it then
connects to an address *it* resolved), and the guests' DNS service forwards the queries the policy lets through.

Both ask one upstream server (``CRYOBOX_DNS_UPSTREAM``, ``address[:port]``; unset, the host's first IPv4
``nameserver``). Answers are cached by their TTL (at most :data:`MAX_TTL_S`, bounded in entries), so a
connection right after the guest's own lookup costs no second round trip.

Every address an answer gave (the guest's own lookups included) is also *pinned* to the names that led to it for
at least :data:`PIN_S`: the egress gate (:mod:`.gate`) lets a guest open a connection to an address only a name
could allow when some allowed name resolved to it here (:meth:`Resolver.names_of`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import dns.asyncquery
import dns.exception
import dns.flags
import dns.message
import dns.name
import dns.rdatatype

from ....errors import InvalidArgument

UPSTREAM_ENV = "CRYOBOX_DNS_UPSTREAM"
TIMEOUT_S = 3.0
MAX_TTL_S = 300.0
NEGATIVE_TTL_S = 5.0
MAX_CACHE = 4096
PIN_S = 600.0
MAX_PINS = 16384
RESOLV_CONF = Path("/etc/resolv.conf")


def host_resolvers(resolv_conf: Path = RESOLV_CONF) -> list[str]:
    """The host's IPv4 name servers (``nameserver`` lines of ``resolv.conf``), loopback stubs included."""
    servers: list[str] = []
    with contextlib.suppress(OSError):
        for line in resolv_conf.read_text().splitlines():
            fields = line.split()
            if len(fields) >= 2 and fields[0] == "nameserver" and ":" not in fields[1]:
                servers.append(fields[1])
    return servers


@dataclass(frozen=True)
class Upstream:
    address: str
    port: int = 53


def upstream_from_env(env: Mapping[str, str] | None = None) -> Upstream | None:
    """``CRYOBOX_DNS_UPSTREAM`` (``10.0.0.53`` or ``10.0.0.53:5353``), else the host's first resolver; ``None``
    when there is none. :raises InvalidArgument: the variable is malformed."""
    raw = (os.environ if env is None else env).get(UPSTREAM_ENV, "").strip()
    if not raw:
        servers = host_resolvers()
        return Upstream(servers[0]) if servers else None
    host, _, port = raw.partition(":")
    try:
        ipaddress.IPv4Address(host)
        number = int(port) if port else 53
    except ValueError as err:
        raise InvalidArgument(f"{UPSTREAM_ENV}={raw!r} is not an IPv4 address[:port]") from err
    if not 1 <= number <= 65535:
        raise InvalidArgument(f"{UPSTREAM_ENV}={raw!r}: port out of range")
    return Upstream(host, number)


class Resolver:
    """Asks ``upstream`` (``None``: nothing resolves)."""

    def __init__(
        self,
        upstream: Upstream | None,
        *,
        clock: Callable[[], float] = time.monotonic,
        timeout_s: float = TIMEOUT_S,
        max_cache: int = MAX_CACHE,
    ) -> None:
        self.upstream = upstream
        self._clock = clock
        self._timeout = timeout_s
        self._max = max_cache
        self._cache: OrderedDict[str, tuple[float, list[ipaddress.IPv4Address]]] = OrderedDict()
        self._inflight: dict[str, asyncio.Future[list[ipaddress.IPv4Address]]] = {}
        self._pins: OrderedDict[ipaddress.IPv4Address, dict[str, float]] = OrderedDict()

    async def exchange(self, query: dns.message.Message) -> dns.message.Message:
        """``query`` answered by the upstream (UDP, then TCP when the answer was truncated).

        :raises dns.exception.DNSException | OSError: no answer in time, or no upstream.
        """
        if self.upstream is None:
            raise OSError("no upstream name server")
        where, port = self.upstream.address, self.upstream.port
        answer = await dns.asyncquery.udp(query, where, timeout=self._timeout, port=port)
        if answer.flags & dns.flags.TC:
            answer = await dns.asyncquery.tcp(query, where, timeout=self._timeout, port=port)
        self._pin_answer(answer)
        return answer

    def names_of(self, ip: ipaddress.IPv4Address) -> list[str]:
        """The names an answer seen here in the last :data:`PIN_S` (or its TTL, if longer) gave ``ip`` for."""
        pinned = self._pins.get(ip)
        if not pinned:
            return []
        now = self._clock()
        return [name for name, until in pinned.items() if until > now]

    def _pin_answer(self, answer: dns.message.Message) -> None:
        names = {q.name.to_text(omit_final_dot=True).lower() for q in answer.question}
        until = self._clock()
        addresses: list[ipaddress.IPv4Address] = []
        for rrset in answer.answer:
            if rrset.rdtype == dns.rdatatype.A:
                names.add(rrset.name.to_text(omit_final_dot=True).lower())
                until = max(until, self._clock() + float(rrset.ttl))
                addresses += [ipaddress.IPv4Address(r.address) for r in rrset]
        until = max(until, self._clock() + PIN_S)
        for ip in addresses:
            pinned = self._pins.setdefault(ip, {})
            pinned.update(dict.fromkeys(names, until))
            self._pins.move_to_end(ip)
            while len(pinned) > 64:  # one address many names point at (a CDN's): the oldest go first
                del pinned[next(iter(pinned))]
        while len(self._pins) > MAX_PINS:
            self._pins.popitem(last=False)

    async def addresses(self, name: str) -> list[ipaddress.IPv4Address]:
        """The IPv4 addresses ``name`` has now (``[]``: none, or the upstream did not answer)."""
        cached = self._cache.get(name)
        if cached is not None and cached[0] > self._clock():
            self._cache.move_to_end(name)
            return cached[1]
        pending = self._inflight.get(name)
        if pending is not None:  # one upstream query per name at a time
            return await asyncio.shield(pending)
        future: asyncio.Future[list[ipaddress.IPv4Address]] = asyncio.get_running_loop().create_future()
        self._inflight[name] = future
        try:
            found, ttl = await self._lookup(name)
            self._remember(name, found, ttl)
            future.set_result(found)
            return found
        except BaseException as err:
            future.set_exception(err)
            future.exception()  # retrieved: waiters re-raise it, nobody logs it as lost
            raise
        finally:
            del self._inflight[name]

    async def _lookup(self, name: str) -> tuple[list[ipaddress.IPv4Address], float]:
        query = dns.message.make_query(dns.name.from_text(name), dns.rdatatype.A)
        try:
            answer = await self.exchange(query)
        except (dns.exception.DNSException, OSError):
            return [], NEGATIVE_TTL_S
        found: list[ipaddress.IPv4Address] = []
        ttl = MAX_TTL_S
        for rrset in answer.answer:
            if rrset.rdtype == dns.rdatatype.A:
                ttl = min(ttl, float(rrset.ttl))
                found += [ipaddress.IPv4Address(r.address) for r in rrset]
        return found, (ttl if found else NEGATIVE_TTL_S)

    def _remember(self, name: str, found: list[ipaddress.IPv4Address], ttl: float) -> None:
        self._cache[name] = (self._clock() + max(1.0, ttl), found)
        self._cache.move_to_end(name)
        while len(self._cache) > self._max:
            self._cache.popitem(last=False)


__all__ = ["PIN_S", "UPSTREAM_ENV", "Resolver", "Upstream", "host_resolvers", "upstream_from_env"]
