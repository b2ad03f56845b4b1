"""The egress proxy's sniffer: real ClientHellos from Python's ssl, hand-built ones for the malformed cases, HTTP
requests whole and in pieces, and the sockaddr_in behind SO_ORIGINAL_DST."""

from __future__ import annotations

import socket
import ssl
import struct
from itertools import pairwise
from unittest import mock

import pytest

from cryobox.agent.net.egress.sniff import MAX_SNIFF, Sniff, _parse_sockaddr_in, original_dst, sniff

MORE = Sniff("more", None)
OPAQUE = Sniff("opaque", None)

# -- TLS helpers ---------------------------------------------------------------------------------------------------


def client_hello(server_hostname: str, *, tls12_only: bool = False) -> bytes:
    """The first flight of a real client: OpenSSL's ClientHello, as the proxy would peek it."""
    ctx = ssl.create_default_context()
    if tls12_only:
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    outgoing = ssl.MemoryBIO()
    conn = ctx.wrap_bio(ssl.MemoryBIO(), outgoing, server_hostname=server_hostname)
    with pytest.raises(ssl.SSLWantReadError):
        conn.do_handshake()
    hello = outgoing.read()
    assert hello[0] == 0x16 and 5 + int.from_bytes(hello[3:5], "big") == len(hello)  # one record
    return hello


def record(fragment: bytes, kind: int = 0x16) -> bytes:
    return bytes([kind, 3, 1]) + len(fragment).to_bytes(2, "big") + fragment


def reframe(hello: bytes, *cuts: int) -> bytes:
    """The one-record hello's handshake message cut at `cuts` into consecutive records."""
    message = hello[5:]
    bounds = [0, *cuts, len(message)]
    return b"".join(record(message[a:b]) for a, b in pairwise(bounds))


def vec(length_bytes: int, data: bytes) -> bytes:
    return len(data).to_bytes(length_bytes, "big") + data


def sni(*entries: tuple[int, bytes]) -> bytes:
    """A server_name extension (type 0) listing (name_type, name) entries."""
    return b"\x00\x00" + vec(2, vec(2, b"".join(bytes([kind]) + vec(2, name) for kind, name in entries)))


def built_hello(
    extensions: bytes | None,
    *,
    version: bytes = b"\x03\x03",
    session_id: bytes = b"",
    suites: bytes = b"\x13\x01",
    compression: bytes = b"\x00",
    trailer: bytes = b"",
) -> bytes:
    """A hand-built ClientHello record; `extensions` is the block's content, None to leave the block out."""
    body = version + bytes(32) + vec(1, session_id) + vec(2, suites) + vec(1, compression)
    body += (b"" if extensions is None else vec(2, extensions)) + trailer
    return record(b"\x01" + len(body).to_bytes(3, "big") + body)


def http(*lines: str, body: bytes = b"") -> bytes:
    return "".join(line + "\r\n" for line in lines).encode() + b"\r\n" + body


# -- TLS -------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tls12_only", [False, True])
def test_a_real_hello_gives_its_sni(tls12_only: bool) -> None:
    assert sniff(client_hello("example.com", tls12_only=tls12_only)) == ("tls", "example.com")


def test_the_sni_is_lowercased_and_loses_its_trailing_dot() -> None:
    hello = client_hello("WWW.Example.COM.")
    assert b"WWW.Example.COM." in hello  # OpenSSL sends it as given: the normalizing is ours
    assert sniff(hello) == ("tls", "www.example.com")


@pytest.mark.parametrize("address", ["10.0.0.1", "2001:db8::1"])
def test_a_hello_to_an_ip_address_carries_no_name(address: str) -> None:
    assert sniff(client_hello(address)) == ("tls", None)


@pytest.mark.parametrize("tls12_only", [False, True])
def test_every_prefix_of_a_hello_asks_for_more(tls12_only: bool) -> None:
    hello = client_hello("api.example.org", tls12_only=tls12_only)
    assert [n for n in range(len(hello)) if sniff(hello[:n]) != MORE] == []
    assert sniff(hello) == ("tls", "api.example.org")


@pytest.mark.parametrize("cuts", [(1,), (3,), (4,), (50,), (200,), (511,), (1, 2, 3, 300)])
def test_a_hello_split_across_records_is_reassembled(cuts: tuple[int, ...]) -> None:
    hello = client_hello("split.example.net")
    framed = reframe(hello, *cuts)
    assert len(framed) == len(hello) + 5 * len(cuts)
    assert [n for n in range(len(framed)) if sniff(framed[:n]) != MORE] == []
    assert sniff(framed) == ("tls", "split.example.net")


def test_what_follows_a_whole_hello_does_not_matter() -> None:
    early_data = record(b"\x00" * 40, kind=0x17)
    assert sniff(client_hello("example.com") + early_data) == ("tls", "example.com")


def test_a_record_of_another_type_before_the_hello_is_whole_is_opaque() -> None:
    framed = reframe(client_hello("example.com"), 100)
    second = 5 + 100
    assert sniff(framed[:second] + b"\x17" + framed[second + 1 :]) == OPAQUE


@pytest.mark.parametrize(
    "data",
    [
        b"\x16\x02",  # record version 2.x
        b"\x16\x03\x01\x00\x00",  # an empty handshake record
        b"\x16\x03\x01\x40\x01",  # a record over 2^14
        b"\x16\x03\x03\x00\x30\x02",  # a ServerHello
        b"\x16\x03\x01\x00\x04\x01\x00\x3f\xf8",  # a hello that cannot fit in MAX_SNIFF with its record header
        b"\x00\x01\x02\x03",
        b"\x80\x2e\x01\x03\x01",  # an SSLv2-framed hello
    ],
)
def test_bytes_that_cannot_start_a_hello_are_opaque(data: bytes) -> None:
    assert sniff(data) == OPAQUE


def test_the_largest_hello_that_fits_is_waited_for() -> None:
    assert sniff(b"\x16\x03\x01\x00\x04\x01\x00\x3f\xf7") == MORE  # 5 + 4 + 16375 == MAX_SNIFF


def test_hand_built_hellos_parse_like_real_ones() -> None:
    assert sniff(built_hello(sni((0, b"example.com")))) == ("tls", "example.com")
    assert sniff(built_hello(b"")) == ("tls", None)
    assert sniff(built_hello(None)) == ("tls", None)  # no extensions block at all (SSL 3.0 style)
    assert sniff(built_hello(sni((1, b"other"), (0, b"example.com")))) == ("tls", "example.com")
    assert sniff(built_hello(b"\x00\x17\x00\x00" + sni((0, b"example.com")))) == ("tls", "example.com")


@pytest.mark.parametrize(
    "hello",
    [
        built_hello(sni((0, b"a.example"), (0, b"b.example"))),  # two host_names
        built_hello(sni((0, b"a.example")) + sni((0, b"b.example"))),  # two server_name extensions
        built_hello(b"\x00\x00\x00\x02\x00\x00"),  # an empty server name list
        built_hello(b"\x00\x00\x00\x06\x00\x04\x00\x00\x05a"),  # an entry longer than its list
        built_hello(sni((0, b"example.com")) + b"\x00"),  # a torn extension
        built_hello(sni((0, b"example.com")), trailer=b"\x00"),  # bytes after the extensions
        built_hello(b"", version=b"\x02\x00"),
        built_hello(b"", session_id=bytes(33)),
        built_hello(b"", suites=b""),
        built_hello(b"", suites=b"\x13\x01\x13"),
        built_hello(b"", compression=b""),
        record(b"\x01\x00\x00\x05\x03\x03\x00\x00\x00"),  # cut short inside the random
    ],
)
def test_a_malformed_hello_is_opaque(hello: bytes) -> None:
    assert sniff(hello) == OPAQUE


def test_a_corrupted_hello_never_raises_nor_names_another_host() -> None:
    hello = reframe(client_hello("example.com"), 60)
    name_at = range(hello.index(b"example.com"), hello.index(b"example.com") + len("example.com"))
    seen = set()
    for i in range(len(hello)):
        for flip in (0x01, 0x80, 0xFF):
            result = sniff(hello[:i] + bytes([hello[i] ^ flip]) + hello[i + 1 :])
            seen.add(result.state)
            assert i in name_at or result.name in (None, "example.com"), (i, flip, result)
    assert seen == {"more", "opaque", "tls"}


# -- names (both protocols) ----------------------------------------------------------------------------------------

NAMES = [
    (b"xn--bcher-kva.example", "xn--bcher-kva.example"),
    (b"_acme-challenge.Example.COM", "_acme-challenge.example.com"),
    (b"localhost", "localhost"),
    (b"a" * 63 + b".com", "a" * 63 + ".com"),
    (b"a" * 64 + b".com", None),
    (b".".join([b"a" * 63] * 3 + [b"a" * 61]) + b".", ".".join(["a" * 63] * 3 + ["a" * 61])),  # 253 + the dot
    (b".".join([b"a" * 63] * 3 + [b"a" * 62]), None),  # 254
    (b"a..b", None),
    (b".example.com", None),
    (b"example.com..", None),
    (b"", None),
    (b"exa mple.com", None),
    (b"ex*ample.com", None),
    (b"b\xc3\xbccher.example", None),
    (b"93.184.216.34", None),
    (b"1.2.3.4.5", None),
    (b"0x7f.1", None),  # inet_aton reads 127.0.0.1
    (b"0x7f000001", None),
]


@pytest.mark.parametrize(("raw", "name"), NAMES)
def test_sni_names_are_validated(raw: bytes, name: str | None) -> None:
    assert sniff(built_hello(sni((0, raw)))) == ("tls", name)


@pytest.mark.parametrize(("raw", "name"), NAMES)
def test_host_names_are_validated(raw: bytes, name: str | None) -> None:
    assert sniff(b"GET / HTTP/1.1\r\nHost: " + raw + b"\r\n\r\n") == ("http", name)


# -- HTTP ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_bytes", "expected"),
    [
        (http("GET / HTTP/1.1", "Host: example.com"), ("http", "example.com")),
        (http("GET /a?b HTTP/1.1", "Host: example.com:8080", "Accept: */*"), ("http", "example.com")),
        (http("POST /x HTTP/1.1", "host: Example.COM.", "Content-Length: 2", body=b"{}"), ("http", "example.com")),
        (http("GET / HTTP/1.1", "User-Agent: t", "HOST: \t example.com \t"), ("http", "example.com")),
        (http("GET http://example.com:81/p HTTP/1.1"), ("http", "example.com")),
        (http("GET HTTPS://Example.com HTTP/1.1", "Host: example.com"), ("http", "example.com")),
        (http("CONNECT example.com:443 HTTP/1.1", "Host: example.com:443"), ("http", "example.com")),
        (http("OPTIONS * HTTP/1.1", "Host: example.com"), ("http", "example.com")),
        (http("VERSION-CONTROL /r HTTP/1.1", "Host: example.com"), ("http", "example.com")),
        (http("GET / HTTP/1.1", "Host: example.com", "Host: example.com"), ("http", "example.com")),
        (http("GET / HTTP/1.0"), ("http", None)),
        (http("GET / HTTP/1.1", "Host:"), ("http", None)),
        (http("GET / HTTP/1.1", "Host: 93.184.216.34"), ("http", None)),
        (http("GET / HTTP/1.1", "Host: 93.184.216.34:80"), ("http", None)),
        (http("GET / HTTP/1.1", "Host: [2001:db8::1]:8080"), ("http", None)),
        (http("GET / HTTP/1.1", "Host: [2001:db8::1]"), ("http", None)),
        (http("GET http://[::1]:80/ HTTP/1.1"), ("http", None)),
        (http("GET / HTTP/1.1", "Host: example.com:http"), ("http", None)),
        (http("GET / HTTP/1.1", "Host: a.example", "Host: b.example"), OPAQUE),
        (http("GET / HTTP/1.1", "Host: a.example", "Host: 10.0.0.1"), OPAQUE),
        (http("GET http://a.example/ HTTP/1.1", "Host: b.example"), OPAQUE),
        (http("GET http://user@a.example/ HTTP/1.1", "Host: a.example"), OPAQUE),
    ],
)
def test_http_requests(request_bytes: bytes, expected: Sniff) -> None:
    assert sniff(request_bytes) == expected


def test_a_request_arriving_in_pieces_asks_for_more_until_its_head_ends() -> None:
    request = http("GET /index.html HTTP/1.1", "Host: www.example.com", "Accept: */*", body=b"ignored")
    end = request.index(b"\r\n\r\n") + 4
    assert [n for n in range(end) if sniff(request[:n]) != MORE] == []
    assert {sniff(request[:n]) for n in range(end, len(request) + 1)} == {("http", "www.example.com")}


@pytest.mark.parametrize(
    "data",
    [
        b"SSH-2.0-OpenSSH_9.6\r\n",
        b"SSH-2",  # already: no method has a digit
        b"get / HTTP/1.1\r\n",
        b" GET / HTTP/1.1\r\n",
        b"\r\nGET / HTTP/1.1\r\n",
        b"GET  / HTTP/1.1\r\n",
        b"GET / HTTX",
        b"GET / HTTP/1.1 \r\n",
        b"GET / HTTP/2.0\r\n",
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        b"GET / HTTP/1.1\nHost: example.com\n\n",
        b"GET / HTTP/1.1\r\nHost: example.com\n",
        b"GET / HTTP/1.1\r\nHost : example.com\r\n",
        b"GET / HTTP/1.1\r\nX: a\r\n folded\r\n\r\n",
        b"GET / HTTP/1.1\r\nX: a\x00b\r\n",
        b"GET foo HTTP/1.1\r\nHost: example.com\r\n\r\n",
        b"GET ftp://example.com/ HTTP/1.1\r\n\r\n",
        b"EHLO mail.example.com\r\n",
        b"A" * 33,  # longer than any method
    ],
)
def test_what_cannot_be_an_http_request_is_opaque_at_once(data: bytes) -> None:
    assert sniff(data) == OPAQUE


def test_a_header_flood_is_opaque_at_max_sniff() -> None:
    flood = b"GET / HTTP/1.1\r\nHost: example.com\r\nX-Pad: " + b"a" * MAX_SNIFF
    assert sniff(flood[: MAX_SNIFF - 1]) == MORE
    assert sniff(flood[:MAX_SNIFF]) == OPAQUE
    assert sniff(flood) == OPAQUE


def test_nothing_yet_asks_for_more() -> None:
    assert sniff(b"") == MORE


# -- original destination ------------------------------------------------------------------------------------------


def sockaddr_in(family: int, port: bytes, address: bytes) -> bytes:
    return struct.pack("=H", family) + port + address + bytes(8)


def test_a_sockaddr_in_is_parsed_with_its_port_in_network_order() -> None:
    raw = sockaddr_in(socket.AF_INET, b"\x01\xbb", bytes([93, 184, 216, 34]))
    assert _parse_sockaddr_in(raw) == ("93.184.216.34", 443)


@pytest.mark.parametrize(
    "raw",
    [sockaddr_in(socket.AF_INET6, b"\x00\x50", bytes(4)), struct.pack("=H", socket.AF_INET) + b"\x00\x50\x7f"],
)
def test_anything_else_raises_oserror(raw: bytes) -> None:
    with pytest.raises(OSError, match="not a sockaddr_in"):
        _parse_sockaddr_in(raw)


def test_original_dst_asks_the_kernel_for_so_original_dst() -> None:
    sock = mock.create_autospec(socket.socket, instance=True)
    sock.getsockopt.return_value = sockaddr_in(socket.AF_INET, b"\x1f\x90", bytes([10, 1, 2, 3]))
    assert original_dst(sock) == ("10.1.2.3", 8080)
    sock.getsockopt.assert_called_once_with(socket.SOL_IP, 80, 16)
