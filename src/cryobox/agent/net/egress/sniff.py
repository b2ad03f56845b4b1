"""Which host name a guest's TCP connection carries, read from the first bytes the guest sent.

The egress proxy accepts the guest's connections (nft REDIRECTs them to it) and peeks at their first bytes before
deciding: a name-based policy needs the TLS ClientHello's SNI or the HTTP/1.x ``Host`` header, and nothing has gone
upstream yet. :func:`sniff` is pure and total so the proxy can call it again on each larger peek: ``"more"`` until
the bytes decide, never an exception. A name is only the guest's claim, so every ambiguity (a malformed hello, two
names that disagree, a header flood) gives ``"opaque"`` and the proxy judges the connection by its address alone.
:func:`original_dst` gives that address.
"""

from __future__ import annotations

import re
import socket
import struct
from typing import Literal, NamedTuple

MAX_SNIFF = 16384  # bytes the proxy buffers at most; a stream still undecided by then is opaque
SO_ORIGINAL_DST = 80  # <linux/netfilter_ipv4.h>: the pre-NAT destination of a REDIRECTed connection


class Sniff(NamedTuple):
    """What a connection's first bytes say: ``"more"`` when they cannot tell yet."""

    state: Literal["more", "tls", "http", "opaque"]
    name: str | None  # lowercased, no trailing dot; None when the protocol carries no (valid) name


_MORE = Sniff("more", None)
_OPAQUE = Sniff("opaque", None)


def sniff(data: bytes) -> Sniff:
    """Classify a connection's first bytes: a TLS ClientHello, an HTTP/1.x request, or neither."""
    if not data:
        return _MORE
    result = _tls(data) if data[0] == 0x16 else _http(data)
    return _OPAQUE if result.state == "more" and len(data) >= MAX_SNIFF else result


def original_dst(sock: socket.socket) -> tuple[str, int]:
    """The address a REDIRECTed connection was sent to (conntrack's, before NAT); OSError when it has none."""
    return _parse_sockaddr_in(sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16))


def _parse_sockaddr_in(raw: bytes) -> tuple[str, int]:
    """Read a ``struct sockaddr_in``: family in host order, then port and address in network order."""
    if len(raw) < 8 or struct.unpack_from("=H", raw)[0] != socket.AF_INET:
        raise OSError(f"not a sockaddr_in: {raw.hex()}")
    return socket.inet_ntoa(raw[4:8]), int.from_bytes(raw[2:4], "big")


# -- names --------------------------------------------------------------------------------------------------------

_NAME = re.compile(rb"[a-z0-9_-]{1,63}(\.[a-z0-9_-]{1,63})*")


def _name(raw: bytes) -> str | None:
    """A host name a policy can match, or None: bad characters or lengths, or an IPv4 literal in disguise."""
    name = raw.lower().removesuffix(b".")
    if len(name) > 253 or not _NAME.fullmatch(name):
        return None
    text = name.decode()
    if text.rpartition(".")[2].isdigit():  # an all-numeric last label is no host name (RFC 3696 section 2)
        return None
    try:
        socket.inet_aton(text)  # "0x7f.1" or "0x7f000001": the resolver would read it as an address
    except OSError:
        return text
    return None


def _host(authority: bytes) -> str | None:
    """The name in ``host[:port]``; None for an IP literal or a malformed authority.

    An IPv6 literal (``[2001:db8::1]:443``) splits at its first colon into a host starting with ``[``, which no
    name has: None, as for any IP literal.
    """
    host, _, port = authority.partition(b":")
    return None if port.strip(b"0123456789") else _name(host)


# -- TLS ----------------------------------------------------------------------------------------------------------


class _Malformed(Exception):
    pass


class _Reader:
    """Reads TLS's big-endian integers and length-prefixed vectors; _Malformed past the end."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise _Malformed
        self.pos += n
        return self.data[self.pos - n : self.pos]

    def uint(self, n: int) -> int:
        return int.from_bytes(self.take(n), "big")

    def vector(self, length_bytes: int) -> bytes:
        return self.take(self.uint(length_bytes))

    def done(self) -> bool:
        return self.pos == len(self.data)


def _tls(data: bytes) -> Sniff:
    """Reassemble the handshake stream across records until the ClientHello is whole, then parse it."""
    handshake, pos = b"", 0
    while True:
        header = data[pos : pos + 5]  # type 0x16 (handshake), version 0x03xx, length; short while arriving
        if header[:1] not in (b"", b"\x16") or header[1:2] not in (b"", b"\x03"):
            return _OPAQUE
        if len(header) < 5:
            return _MORE
        length = int.from_bytes(header[3:5], "big")
        if not 0 < length <= 2**14:  # RFC 8446 5.1: no empty handshake records, none over 2^14
            return _OPAQUE
        handshake += data[pos + 5 : pos + 5 + length]
        pos += 5 + length
        if handshake[:1] not in (b"", b"\x01"):  # handshake type 1, ClientHello
            return _OPAQUE
        if len(handshake) >= 4:
            need = int.from_bytes(handshake[1:4], "big")
            if 9 + need > MAX_SNIFF:  # one record header plus the message cannot fit: waiting is useless
                return _OPAQUE
            if len(handshake) >= 4 + need:
                try:
                    return Sniff("tls", _client_hello(handshake[4 : 4 + need]))
                except _Malformed:
                    return _OPAQUE


def _client_hello(body: bytes) -> str | None:
    """The SNI host name of a ClientHello body (RFC 8446 4.1.2, RFC 6066 3); _Malformed when it is not one."""
    hello = _Reader(body)
    if hello.take(2)[0] != 3:  # legacy_version
        raise _Malformed
    hello.take(32)  # random
    session_id, suites, compression = hello.vector(1), hello.vector(2), hello.vector(1)
    if len(session_id) > 32 or not suites or len(suites) % 2 or not compression:
        raise _Malformed
    if hello.done():  # a hello from before extensions existed
        return None
    extensions = _Reader(hello.vector(2))
    if not hello.done():
        raise _Malformed
    seen: set[int] = set()
    name = None
    while not extensions.done():
        kind, extension = extensions.uint(2), extensions.vector(2)
        if kind in seen:  # RFC 8446 4.2: at most one of each; two server_names could fool one reader
            raise _Malformed
        seen.add(kind)
        if kind == 0:
            name = _server_name(extension)
    return name


def _server_name(extension: bytes) -> str | None:
    """The host_name entry of a server_name extension: a non-empty list holding at most one per name type."""
    outer = _Reader(extension)
    names = _Reader(outer.vector(2))
    if not outer.done() or names.done():
        raise _Malformed
    host = None
    while not names.done():
        kind, value = names.uint(1), names.vector(2)
        if kind == 0:
            if host is not None:
                raise _Malformed
            host = value
    return None if host is None else _name(host)


# -- HTTP/1.x -----------------------------------------------------------------------------------------------------

_METHOD = rb"[A-Z][A-Z_-]{0,31}"
_TARGET = rb"[\x21-\x7e]+"
_REQUEST_LINE = re.compile(rb"(?P<method>" + _METHOD + rb") (?P<target>" + _TARGET + rb") HTTP/1\.[0-9]")
# A first line whose CRLF has not arrived: a method, then maybe a target, then maybe a version spelled so far.
_REQUEST_PREFIX = re.compile(_METHOD + rb"( [\x21-\x7e]*| " + _TARGET + rb" (H(T(T(P(/(1(\.([0-9]\r?)?)?)?)?)?)?)?)?)?")
_FIELD = re.compile(rb"([!#$%&'*+.^_`|~0-9A-Za-z-]+):[ \t]*([\t\x20-\x7e\x80-\xff]*?)[ \t]*")
_ABSOLUTE = re.compile(rb"https?://([^/?#]*)", re.IGNORECASE)


def _http(data: bytes) -> Sniff:
    """Parse the request head strictly: a lenient reader could see a Host the upstream server does not."""
    head, end, _ = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    tail = b"" if end else lines.pop()  # the line still arriving
    if not lines:
        return _MORE if _REQUEST_PREFIX.fullmatch(tail) else _OPAQUE
    request = _REQUEST_LINE.fullmatch(lines[0])
    fields = [_FIELD.fullmatch(line) for line in lines[1:]]  # an obs-folded or bare-LF line fails too
    if request is None or None in fields or b"\n" in tail or b"\r" in tail[:-1]:
        return _OPAQUE
    if not end:
        return _MORE
    authorities = [field[2] for field in fields if field and field[1].lower() == b"host"]
    target = request["target"]
    if request["method"] == b"CONNECT":
        authorities.append(target)
    elif absolute := _ABSOLUTE.match(target):  # its authority overrides Host for the server (RFC 9112 3.2.2)
        authorities.append(absolute[1])
    elif not target.startswith(b"/") and target != b"*":
        return _OPAQUE
    names = {_host(authority) for authority in authorities}
    if len(names) > 1:  # the request names two hosts: which one the server serves is its choice
        return _OPAQUE
    return Sniff("http", names.pop() if names else None)
