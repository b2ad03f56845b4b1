"""The stand-in internet's DNS (:mod:`tests.support.internet`): an authoritative server for a name map that tests
change while it runs, which remembers every name it was asked, so a test can show a denied name never left the
host as well as what a permitted one resolved to."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterable
from dataclasses import dataclass

import dns.exception
import dns.flags
import dns.message
import dns.opcode
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset


def normal(name: str) -> str:
    """How names are kept and recorded: lower case, no final dot."""
    return name.lower().rstrip(".")


@dataclass(frozen=True)
class Records:
    ipv4: tuple[str, ...]
    ipv6: tuple[str, ...]


class Zone:
    """Names and their A/AAAA answers, and every name asked (thread-safe: the servers answer on their own
    threads while a test adds names or reads the log). Unknown names are NXDOMAIN; a known name without
    records of the asked type answers NOERROR with no records. A name ``*.example.test`` answers for every name
    below ``example.test`` that has no answers of its own (DNS's wildcard)."""

    def __init__(self, ttl: int) -> None:
        self.ttl = ttl
        self._lock = threading.Lock()
        self._names: dict[str, Records] = {}
        self._queries: list[str] = []

    def set(self, name: str, ipv4: Iterable[str] = (), ipv6: Iterable[str] = ()) -> None:
        """Add ``name`` or replace its answers (the next query sees them: DNS rebinding tests change an answer
        between two lookups)."""
        records = Records(tuple(ipv4), tuple(ipv6))
        if not records.ipv4 and not records.ipv6:
            raise ValueError(f"{name}: give at least one address")
        with self._lock:
            self._names[normal(name)] = records

    def remove(self, name: str) -> None:
        with self._lock:
            self._names.pop(normal(name), None)

    def lookup(self, name: str) -> Records | None:
        with self._lock:
            return self._find(normal(name))

    def _find(self, name: str) -> Records | None:
        """``name``'s answers, or its closest wildcard's (the lock held)."""
        found = self._names.get(name)
        parent = name
        while found is None and "." in parent:
            parent = parent.partition(".")[2]
            found = self._names.get(f"*.{parent}")
        return found

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._names)

    @property
    def queries(self) -> list[str]:
        """Every name asked, in order, repeats kept (a copy)."""
        with self._lock:
            return list(self._queries)

    def clear_queries(self) -> None:
        with self._lock:
            self._queries.clear()

    def answer(self, wire: bytes) -> bytes | None:
        """The response to one DNS message (None: not a DNS query; no answer, as a real server would drop it)."""
        try:
            query = dns.message.from_wire(wire)
        except dns.exception.DNSException:
            return None
        if query.flags & dns.flags.QR:
            return None
        response = dns.message.make_response(query)
        response.flags |= dns.flags.AA | dns.flags.RA  # the authority, and what a stub takes for its resolver
        if query.opcode() != dns.opcode.QUERY:
            response.set_rcode(dns.rcode.NOTIMP)
            return response.to_wire()
        for question in query.question:
            name = normal(question.name.to_text())
            with self._lock:
                self._queries.append(name)
                records = self._find(name)
            if records is None:
                response.set_rcode(dns.rcode.NXDOMAIN)
                continue
            if question.rdclass != dns.rdataclass.IN:
                continue
            found = {dns.rdatatype.A: records.ipv4, dns.rdatatype.AAAA: records.ipv6}.get(question.rdtype, ())
            if found:
                rrset = dns.rrset.from_text_list(question.name, self.ttl, dns.rdataclass.IN, question.rdtype, found)
                response.answer.append(rrset)
        return response.to_wire()

    def serve_datagram(self, data: bytes) -> bytes | None:
        return self.answer(data)

    def serve_stream(self, conn: socket.socket, _sni: str | None) -> None:
        """DNS over TCP: two-byte length, message; as many as the client sends on the connection."""
        while (head := _exactly(conn, 2)) is not None:
            wire = _exactly(conn, int.from_bytes(head, "big"))
            if wire is None:
                return
            reply = self.answer(wire)
            if reply is None:
                return
            conn.sendall(len(reply).to_bytes(2, "big") + reply)


def _exactly(conn: socket.socket, size: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < size:
        chunk = conn.recv(size - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)
