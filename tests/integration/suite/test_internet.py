"""The suite's stand-in for the internet (tests/support/internet.py), checked from the host namespace before any
egress test relies on it: its DNS answers and records, its servers say what reached them (address, Host, SNI,
body) over TLS a client really verifies, and it leaves no namespace, link or thread behind.

All traffic stays on this machine: between the host and the namespace the test creates."""

from __future__ import annotations

import http.client
import json
import secrets
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

import dns.message
import dns.query
import dns.rcode
import dns.rdatatype
import pytest

from tests.support import internet_servers
from tests.support.internet import Internet, internet, reclaim_internet
from tests.support.internet_servers import BANNER

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def net() -> Iterator[Internet]:
    with internet(secrets.token_hex(3)) as running:
        yield running
        assert running.errors == []


def _resolve(net: Internet, name: str, rdtype: str = "A", tcp: bool = False) -> tuple[str, list[str]]:
    query = dns.message.make_query(name, rdtype)
    reply = dns.query.tcp(query, net.dns, timeout=3) if tcp else dns.query.udp(query, net.dns, timeout=3)
    return dns.rcode.to_text(reply.rcode()), sorted(r.to_text() for rrset in reply.answer for r in rrset)


def _request(
    address: str, port: int, host: str, path: str = "/", tls: Internet | None = None, sni: str | None = None, **kw: Any
) -> tuple[int, bytes]:
    """One HTTP request to ``address`` whatever ``host`` resolves to. Over TLS if ``tls`` is given: verified
    against its CA for ``sni``, the name the client checks (an address: no SNI is sent). ``kw`` goes to
    ``HTTPConnection.request``."""
    sock = socket.create_connection((address, port), timeout=5)
    if tls is not None:
        try:
            sock = tls.client_context().wrap_socket(sock, server_hostname=sni)
        except BaseException:
            sock.close()
            raise
    conn = http.client.HTTPConnection(host)
    conn.sock = sock
    try:
        conn.request(kw.pop("method", "GET"), path, **kw)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def test_dns_answers_the_zone_over_udp_and_tcp_and_records_every_name(net: Internet) -> None:
    net.clear_queries()
    ten, twelve = net.servers[0], net.servers[2]
    assert _resolve(net, "example.org") == ("NOERROR", [ten])
    assert _resolve(net, "Example.ORG.", tcp=True) == ("NOERROR", [ten])
    assert _resolve(net, "cdn-a.example.net") == _resolve(net, "cdn-b.example.net", tcp=True) == ("NOERROR", [twelve])
    assert net.addr("cdn-a.example.net") == net.addr("cdn-b.example.net") == twelve
    assert _resolve(net, "rebind.example.org") == ("NOERROR", ["10.0.0.5"])
    assert _resolve(net, "meta.example.org") == ("NOERROR", ["169.254.169.254"])
    assert _resolve(net, "v6.example.org", "AAAA") == ("NOERROR", [net.server_ip6])
    assert _resolve(net, "v6.example.org", "A") == ("NOERROR", [])  # known name, no such record
    assert _resolve(net, "nowhere.example.org") == ("NXDOMAIN", [])
    assert _resolve(net, "nowhere.example.org", tcp=True) == ("NXDOMAIN", [])
    assert net.queries == [
        "example.org",
        "example.org",
        "cdn-a.example.net",
        "cdn-b.example.net",
        "rebind.example.org",
        "meta.example.org",
        "v6.example.org",
        "v6.example.org",
        "nowhere.example.org",
        "nowhere.example.org",
    ]
    with pytest.raises(KeyError):
        net.addr("nowhere.example.org")


def test_a_name_added_while_running_resolves_and_serves_https(net: Internet) -> None:
    net.add_name("late.example.com", [net.servers[3]])
    assert _resolve(net, "late.example.com") == ("NOERROR", [net.servers[3]])
    status, body = _request(net.servers[3], 443, "late.example.com", tls=net, sni="late.example.com")
    assert status == 200 and json.loads(body)["sni"] == "late.example.com"
    net.add_name("late.example.com", ["10.0.0.6"])  # rebinding: the next answer differs
    assert _resolve(net, "late.example.com") == ("NOERROR", ["10.0.0.6"])
    net.remove_name("late.example.com")
    assert _resolve(net, "late.example.com")[0] == "NXDOMAIN"


def test_https_verifies_against_the_test_ca_and_reports_the_sni(net: Internet) -> None:
    twelve = net.servers[2]
    status, body = _request(twelve, 443, "cdn-b.example.net", "/a?b=1", tls=net, sni="cdn-b.example.net")
    assert status == 200
    assert json.loads(body) == {
        "server": twelve,
        "host": "cdn-b.example.net",
        "sni": "cdn-b.example.net",
        "path": "/a?b=1",
        "bytes": 0,
    }
    # the Host header and the SNI are reported apart: a proxy's tests compare them
    _, body = _request(twelve, 443, "cdn-a.example.net", tls=net, sni="cdn-b.example.net")
    assert (json.loads(body)["host"], json.loads(body)["sni"]) == ("cdn-a.example.net", "cdn-b.example.net")
    # a client naming an address sends no SNI, and checks the address against the certificate
    _, body = _request(twelve, 443, twelve, tls=net, sni=twelve)
    assert json.loads(body)["sni"] is None
    with socket.create_connection((twelve, 443), timeout=5) as sock:
        with pytest.raises(ssl.SSLCertVerificationError):  # a client trusting only the system's CAs says no
            ssl.create_default_context().wrap_socket(sock, server_hostname="cdn-b.example.net")


def test_http_echoes_host_path_and_body_length(net: Internet) -> None:
    ten = net.servers[0]
    status, body = _request(ten, 80, "www.example.org", "/p?q")
    assert status == 200
    assert json.loads(body) == {"server": ten, "host": "www.example.org", "sni": None, "path": "/p?q", "bytes": 0}
    _, body = _request(ten, 80, "example.org", method="POST", body=b"x" * 12345)
    assert json.loads(body)["bytes"] == 12345
    _, body = _request(ten, 80, "example.org", method="PUT", body=iter([b"ab", b"cde"]), encode_chunked=True)
    assert json.loads(body)["bytes"] == 5
    for address in net.servers:
        assert json.loads(_request(address, 80, "x")[1])["server"] == address


def test_blob_streams_exactly_the_size_asked(net: Internet) -> None:
    status, body = _request(net.servers[0], 80, "example.org", "/blob?size=1000000")
    assert status == 200 and len(body) == 1_000_000
    status, body = _request(net.servers[1], 443, "api.example.com", "/blob?size=70000", tls=net, sni="api.example.com")
    assert status == 200 and len(body) == 70_000


def test_udp_echo_and_the_banner_server(net: Internet) -> None:
    for port in (443, 9999):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.settimeout(3)
            sock.sendto(b"quic-ish %d" % port, (net.servers[0], port))
            assert sock.recvfrom(2048) == (b"quic-ish %d" % port, (net.servers[0], port))
    with socket.create_connection((net.servers[1], 7000), timeout=5) as sock:
        assert _read(sock, len(BANNER)) == b"SSH-2.0-test\r\n"
        sock.sendall(b"hello")
        assert _read(sock, 5) == b"hello"


def _read(sock: socket.socket, size: int) -> bytes:
    buf = b""
    while len(buf) < size and (chunk := sock.recv(size - len(buf))):
        buf += chunk
    return buf


def test_ipv6_is_reachable_from_the_host(net: Internet) -> None:
    status, body = _request(net.server_ip6, 80, "v6.example.org")
    assert status == 200 and json.loads(body)["server"] == net.server_ip6
    _, body = _request(net.server_ip6, 443, "v6.example.org", tls=net, sni="v6.example.org")
    assert json.loads(body)["sni"] == "v6.example.org"


def _threads(tag: str) -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(f"cryobox-{tag}-")]


def _host_has(tag: str) -> tuple[bool, bool]:
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    return f"cryobox-{tag}-net" in netns, f"xi{tag}" in links


def test_everything_goes_when_the_block_ends_even_with_a_connection_open() -> None:
    tag = secrets.token_hex(3)
    with internet(tag) as net:
        assert _host_has(tag) == (True, True)
        held = socket.create_connection((net.servers[0], 7000), timeout=5)  # a client that never hangs up
        assert _read(held, len(BANNER)) == BANNER
        assert _threads(tag)
    try:
        assert _host_has(tag) == (False, False)
        assert _threads(tag) == []
        assert held.recv(10) == b""  # the server side was shut
    finally:
        held.close()
    net.close()  # idempotent


def test_a_failure_mid_setup_leaves_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: internet_servers.Hub) -> None:
        raise RuntimeError("hub failed to start")

    monkeypatch.setattr(internet_servers.Hub, "start", broken)
    tag = secrets.token_hex(3)
    with pytest.raises(RuntimeError, match="hub failed"):
        with internet(tag):
            pass
    assert _host_has(tag) == (False, False)


def test_leftovers_are_reclaimed_by_tag() -> None:
    tag = secrets.token_hex(3)
    subprocess.run(["ip", "netns", "add", f"cryobox-{tag}-net"], check=True)
    peer = ["peer", "name", "eth0", "netns", f"cryobox-{tag}-net"]
    subprocess.run(["ip", "link", "add", f"xi{tag}", "type", "veth", *peer], check=True)
    assert _host_has(tag) == (True, True)
    assert sorted(reclaim_internet(tag)) == [f"link xi{tag}", f"netns cryobox-{tag}-net"]
    assert _host_has(tag) == (False, False)
    assert reclaim_internet(tag) == []


def test_a_tag_in_use_is_refused_and_kept() -> None:
    tag = secrets.token_hex(3)
    with internet(tag) as first:
        with pytest.raises(FileExistsError):
            with internet(tag):
                pass
        assert _request(first.servers[0], 80, "example.org")[0] == 200  # the first one still runs
    with pytest.raises(ValueError, match="6 lowercase hex"):
        with internet("NOTHEX"):
            pass
